// A job's space on a tier, <tier>/monarch-<key>: made at the job's first
// step on the node (as root, in slurmstepd), checked by every later step,
// released at the job's end (the epilog) or, if that never came, by a
// sweep (sweep.h). It is a plain directory or a mounted image (job_space
// in monarch.conf; image.h) and always the user's, mode 0700. Everything
// here runs under the tier's lock and acts only on what the job's record
// (record.h) names.
#pragma once

#include <string>

#include "process.h"
#include "record.h"
#include "tier.h"

namespace monarch::spank {

// Makes the job's space as `want` says, or finds the one an earlier step
// of the same job made. A record of another boot or another user, or a
// space that is not as recorded, is released first and the space made
// again. An unrecorded entry at <tier>/monarch-<key> (not the plugin's) is
// left alone and refused. Throws TierError.
void prepare_space(const Tier& tier, const JobRecord& want, const User& user);

// What release_space did, for the log.
struct Release {
  int detached = 0;     // mounts detached (the image, and the job's own)
  bool moved = false;   // the job's directory went to the trash
  std::string problem;  // "" when everything named by the record is gone
};

// Detaches every mount at and below the job's directory, moves the
// directory (or the image's mount point, and the image) into the trash,
// and removes the record, in constant time whatever the job left. A record
// that cannot be completed (a mount that would not detach) is kept for the
// next sweep.
Release release_space(const Tier& tier, const JobRecord& record);

}  // namespace monarch::spank
