// monarch-purge DIR: deletes everything in the trash directory DIR (see
// trash.h), at the lowest CPU and I/O priority, with memory and descriptors
// bounded whatever the trash holds. Started in the background by the Slurm
// plugin (as root, on <tier>/.monarch/trash) and usable by hand. DIR must
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

#include "fd.h"
#include "trash.h"

namespace {

// ioprio_set(2) has no glibc wrapper: best-effort class, lowest level.
constexpr int kIoprioWhoProcess = 1;
constexpr int kIoprioClassBestEffort = 2;
constexpr int kIoprioLowest = 7;
constexpr int kIoprioClassShift = 13;

}  // namespace

int main(int argc, char** argv) {
  using namespace monarch;
  if (argc != 2 || argv[1][0] != '/') {
    std::fprintf(stderr, "usage: monarch-purge DIR (the absolute path of a trash directory)\n");
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
  (void)!nice(19);
  syscall(SYS_ioprio_set, kIoprioWhoProcess, 0,
          (kIoprioClassBestEffort << kIoprioClassShift) | kIoprioLowest);

  PurgeResult r = purge_trash(trash.get());
  struct rusage ru = {};
  getrusage(RUSAGE_SELF, &ru);
  if (r.busy) {
    std::fprintf(stderr, "monarch-purge: %s: another purge runs\n", dir);
    return 0;
  }
  std::fprintf(stderr,
               "monarch-purge: %s: %llu entries deleted (%llu files and directories), %llu mount "
               "points and %llu errors left; peak memory %ld KiB\n",
               dir, static_cast<unsigned long long>(r.entries),
               static_cast<unsigned long long>(r.removed.removed),
               static_cast<unsigned long long>(r.removed.mounts),
               static_cast<unsigned long long>(r.removed.errors), ru.ru_maxrss);
  if (r.removed.errors)
    std::fprintf(stderr, "monarch-purge: first error: %s: %s\n", r.removed.first_path.c_str(),
                 std::strerror(r.removed.first_errno));
  return r.removed.mounts || r.removed.errors ? 1 : 0;
}
