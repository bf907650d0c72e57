// A job's space on a tier, <tier>/monarch-<key>: made at the job's first
// step on the node (as root, in slurmstepd), checked by every later step,
// released at the job's end (the epilog) or, if that never came, by a
// sweep (sweep.h). It is a mount of its own, recorded by its id: the
// directory bound on itself or a mounted image (job_space in monarch.conf;
// image.h), and always the user's, mode 0700. Everything
// here runs under the tier's lock and acts only on what the job's record
// (record.h) names.
#pragma once

#include <string>

#include "process.h"
#include "record.h"
#include "tier.h"

namespace monarch::spank {

// Makes the job's space as `want` says, or finds the one an earlier step
// of the same run of the job made. A record of another run (another boot,
// user or restart count: a requeue, a crash) is released first and the
// space made again. A space of this run that is not as recorded (the job
// mounted something on it) is refused, and released at the job's end. An
// unrecorded entry at <tier>/monarch-<key> (not the plugin's) is left alone
// and refused. Throws TierError.
void prepare_space(const Tier& tier, const JobRecord& want, const User& user);

// What release_space did, for the log.
struct Release {
  int mounts = 0;       // mounts the job left at and below its directory (not the space's own)
  bool moved = false;   // the job's directory went to the trash
  std::string problem;  // "" when everything named by the record is gone
  // The job's image, shut down and detached, still held: whoever closes
  // this last pays for letting the file system go; the epilog hands it to
  // monarch-purge (trash.h).
  Fd image;
};

// Detaches every mount at and below the job's directory (the image shut
// down first), moves the directory (or the image's mount point, and the
// image) into the trash, and removes the record, in constant time whatever
// the job left. A record that cannot be completed (a mount that would not
// detach) is kept for the next sweep.
Release release_space(const Tier& tier, const JobRecord& record);

}  // namespace monarch::spank
