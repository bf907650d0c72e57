#include "serve.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <time.h>

#include <cstdio>

#include "handlers.h"
#include "process.h"

namespace monarch {

namespace {

// <tier's job directory here>/<name>; false when the tier is not visible here.
bool in_tier(uint32_t tier, const char* name, char* out, size_t cap) {
  const char* dir = tier < uint32_t(kMapTiers) ? located().tier[tier] : "";
  int n = std::snprintf(out, cap, "%s/%s", dir, name);
  return *dir && n > 0 && size_t(n) < cap;
}

}  // namespace

bool copy_path(const JobMap* m, uint32_t file, uint32_t tier, char* out, size_t cap) {
  char name[2 * kPathMax + 64];  // as large as any caller's path
  return copy_name(*m, file, name, sizeof name) && in_tier(tier, name, out, cap);
}

bool partial_path(const JobMap* m, uint32_t file, uint32_t tier, char* out, size_t cap) {
  char name[64];
  return partial_name(*m, file, name, sizeof name) && in_tier(tier, name, out, cap);
}

bool pfs_path(const JobMap* m, uint32_t file, char* out, size_t cap) {
  std::string_view rel = m->path(file);
  const Located& l = located();
  int n = std::snprintf(out, cap, "%s/%.*s", l.view[l.pfs], int(rel.size()), rel.data());
  return l.views > 0 && !rel.empty() && n > 0 && size_t(n) < cap;
}

int open_pfs(const FdEntry* e, int flags) {
  char path[2 * kPathMax];
  if (!pfs_path(e->map, e->file, path, sizeof path)) return errno = ENAMETOOLONG, -1;
  int fd = real::open(path, O_RDONLY | O_CLOEXEC | flags);
  rlimit rl;
  if (fd < 0 && errno == EMFILE && getrlimit(RLIMIT_NOFILE, &rl) == 0 &&
      rl.rlim_cur < rl.rlim_max) {
    // The program is at its limit; the kernel, reading its own descriptor,
    // would need no other. One more for this one call, and the limit back.
    rlimit more = rl;
    more.rlim_cur++;
    if (setrlimit(RLIMIT_NOFILE, &more) == 0) {
      fd = real::open(path, O_RDONLY | O_CLOEXEC | flags);
      KeepErrno k;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  if (fd >= 0) add(e->map, c_pfs_opens);
  return fd;
}

void backoff(int round) {
  timespec ts{0, round < 10 ? 20'000 : round < 40 ? 200'000 : 1'000'000};
  nanosleep(&ts, nullptr);
}

}  // namespace monarch
