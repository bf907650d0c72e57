// Mounts at or below a job's directory, detached without ever looking into
// them and without resolving a path through any of them: the job's own
// mount (its image, image.h, or its directory bound on itself, job_space.h)
// and whatever the job mounted there (a FUSE mount, whose daemon may never
// answer). A lazy detach (MNT_DETACH) returns at once whatever the mounted
// file system does, and takes the mounts below along; what was mounted is
// not touched. A mount is reached by one name looked up in a directory of
// the tier's own file system (the top of what is mounted there, whose root
// the kernel holds: no file system is asked), never by a path a user could
// bend: opened without following links, without leaving the tier and
// without crossing a mount (RESOLVE_NO_XDEV).
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
  int found = 0;     // mounts at or below the name, before, other than `own`
  int detached = 0;  // detach calls that worked (each takes the mounts below along)
  int failed = 0;
  int first_errno = 0;
};

// Detaches every mount at or below `name` in the tier directory `tier_fd`,
// whose path (as /proc/self/mountinfo names it) is `tier_path`. First the
// mounts stacked at `name` itself, from the top down to the tier's own
// mount: once the job's own mount `own` is reached, its detach takes
// everything the job mounted inside in one call, so the work does not grow
// with what the job mounted there. Then any mount made directly on the
// tier's file system below `name` (a directory that is not a mount of its
// own), shallowest first, each through its parent directory opened without
// crossing a mount. `own`, when met and `own_root` is given, is opened into
// `own_root` before it is detached: the caller holds it still mounted,
// detached, until it lets go.
DetachResult detach_mounts(int tier_fd, const std::string& tier_path, const std::string& name,
                           uint64_t own = 0, Fd* own_root = nullptr);

}  // namespace monarch::spank
