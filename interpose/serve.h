// Small pieces the handlers share: where a file's copy and PFS file are,
// waiting politely, and keeping errno.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "fdtable.h"
#include "jobmap.h"

namespace monarch {

// Restores errno on scope exit: bookkeeping after the real call never changes
// what the caller sees.
struct KeepErrno {
  int saved = errno;
  ~KeepErrno() { errno = saved; }
};

// <tier job dir>/data/<path>, the complete copy, with the tier's job
// directory as this process sees it; false when it does not fit, or the tier
// is not visible here.
bool copy_path(const JobMap* m, uint32_t file, uint32_t tier, char* out, size_t cap);
// <tier job dir>/tmp/<generation>-<id>, the copy being written.
bool partial_path(const JobMap* m, uint32_t file, uint32_t tier, char* out, size_t cap);
// <dataset root>/<path>, the PFS file, through the view of the root that
// the PFS is opened through here.
bool pfs_path(const JobMap* m, uint32_t file, char* out, size_t cap);

// Opens the PFS file a tracked descriptor stands for, by its path, for one
// call (read-only, plus `flags`); -1 with errno set when it cannot.
int open_pfs(const FdEntry* e, int flags = 0);

// Sleeps a little, longer as `round` grows (20 us, then 200 us, then 1 ms).
void backoff(int round);

}  // namespace monarch
