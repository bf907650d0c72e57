// monarch-purge DIR [--log FILE]: deletes everything in the trash directory
// DIR (see trash.h), at the lowest CPU and I/O priority, with memory and
// descriptors bounded whatever the trash holds, and says what it did (files
// deleted, what was left, its peak memory) in one line on stderr, or
// appended to FILE (which must be the caller's; it is emptied above 1 MiB).
// Started in the background by the Slurm plugin (as root, on
// <tier>/.monarch/trash, logging to <tier>/.monarch/purge.log) and usable
// by hand. DIR must
// belong to the caller and be private to it (mode 0700 or stricter): the
// purge never works where anyone else could change the tree under it.
// Exit status: 0 when the trash is empty in the end (or another purge of it
// runs), 1 when something is left (mount points, errors), 2 for bad usage.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "fd.h"
#include "trash.h"

namespace {

constexpr off_t kMaxLog = 1 << 20;

// stderr appended to `path`, a regular file of the caller's.
bool log_to(const char* path) {
  monarch::Fd fd(open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600));
  struct stat st;
  if (!fd || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
    return false;
  if (st.st_size > kMaxLog && ftruncate(fd.get(), 0) != 0) return false;
  return dup2(fd.get(), 2) == 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace monarch;
  bool with_log = argc == 4 && std::strcmp(argv[2], "--log") == 0;
  if ((argc != 2 && !with_log) || argv[1][0] != '/') {
    std::fprintf(stderr,
                 "usage: monarch-purge DIR [--log FILE] (DIR: the absolute path of a trash "
                 "directory)\n");
    return 2;
  }
  if (with_log && !log_to(argv[3])) {
    std::fprintf(stderr, "monarch-purge: --log %s: %s\n", argv[3], std::strerror(errno));
    return 2;
  }
  const char* dir = argv[1];
  Fd trash(open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (!trash || fstat(trash.get(), &st) != 0) {
    std::fprintf(stderr, "monarch-purge: %s: %s\n", dir, std::strerror(errno));
    return 2;
  }
  if (st.st_uid != geteuid() || (st.st_mode & 077)) {
    std::fprintf(stderr,
                 "monarch-purge: %s: owner uid %u, mode %04o: a trash must be the caller's and "
                 "private to it (mode 0700); nothing deleted\n",
                 dir, unsigned(st.st_uid), unsigned(st.st_mode & 07777));
    return 2;
  }
  lowest_priority();

  timespec start, end;
  clock_gettime(CLOCK_MONOTONIC, &start);
  PurgeResult r = purge_trash(trash.get());
  clock_gettime(CLOCK_MONOTONIC, &end);
  struct rusage ru = {};
  getrusage(RUSAGE_SELF, &ru);
  char when[32];
  time_t now = time(nullptr);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", localtime(&now));
  if (r.busy) {
    std::fprintf(stderr, "%s monarch-purge: %s: another purge runs\n", when, dir);
    return 0;
  }
  double seconds = double(end.tv_sec - start.tv_sec) + double(end.tv_nsec - start.tv_nsec) / 1e9;
  std::fprintf(stderr,
               "%s monarch-purge: %s: %llu entries deleted (%llu files and directories) in %.1f s, "
               "%llu mount points and %llu errors left; peak memory %ld KiB\n",
               when, dir, static_cast<unsigned long long>(r.entries),
               static_cast<unsigned long long>(r.removed.removed), seconds,
               static_cast<unsigned long long>(r.removed.mounts),
               static_cast<unsigned long long>(r.removed.errors), ru.ru_maxrss);
  if (r.removed.errors)
    std::fprintf(stderr, "monarch-purge: first error: %s: %s\n", r.removed.first_path.c_str(),
                 std::strerror(r.removed.first_errno));
  return r.removed.mounts || r.removed.errors ? 1 : 0;
}
