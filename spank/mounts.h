// Mounts at or below a job's directory, detached without ever looking into
// them: the job's own image (image.h) and whatever the job mounted there
// (a FUSE mount, whose daemon may never answer). A lazy detach (MNT_DETACH)
// returns at once whatever the mounted file system does, and takes the
// mounts below along; what was mounted is not touched. Mount points come
// from /proc/self/mountinfo and are reached through descriptors opened
// without following links and without leaving the tier
// (RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH), never by a path a user could
// bend.
#pragma once

#include <cstdint>
#include <string>

#include "fd.h"

namespace monarch::spank {

// The mount id of what `name` in `dirfd` is (the mount on top when it is a
// mount point), of `dirfd` itself for ""; 0 when it is not there. Read from
// /proc/self/fdinfo of an O_PATH descriptor: no file system is asked.
uint64_t mount_id_at(int dirfd, const char* name);

struct DetachResult {
  int found = 0;     // mounts at or below the name, before
  int detached = 0;  // detach calls that worked (each takes the mounts below along)
  int failed = 0;
  int first_errno = 0;
};

// Detaches every mount at or below `name` in the tier directory `tier_fd`,
// whose path (as /proc/self/mountinfo names it) is `tier_path`. The mount
// `own` (the job's image), when met, is opened into `own_root` before it is
// detached: the caller holds it still mounted, detached, until it lets go.
DetachResult detach_mounts(int tier_fd, const std::string& tier_path, const std::string& name,
                           uint64_t own = 0, Fd* own_root = nullptr);

}  // namespace monarch::spank
