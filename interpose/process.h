// The state of the interposition library in one process: the job it belongs
// to, the job map once it is published, and who owns this memory.
#pragma once

#include <fcntl.h>
#include <limits.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <atomic>
#include <cstddef>
#include <cstring>

#include "jobmap.h"
#include "paths.h"
#include "views.h"

namespace monarch {

// Where the dataset and the job's tiers are in this process's namespace
// (views.h). Made whole before it is published, never changed after: a new
// map brings a new one.
struct Located {
  int views;  // paths that reach the dataset root; the first is the root as given until a map
  int pfs;    // the view the PFS is opened through (a physical one where there is one)
  bool physical[kViews];
  size_t len[kViews];
  char view[kViews][kPathMax];
  char real[kViews][kPathMax];     // the kernel's name of each view (symbolic links resolved)
  char tier[kMapTiers][kPathMax];  // each tier's job directory here; "" where it is not visible
  Views as_views() const;
};

struct Process {
  bool enabled;  // the job's environment names a dataset and a job directory
  bool log;
  bool quiet;  // say() says nothing: not Slurm's task 0, or an ancestor said it
  bool said;
  // Descriptor 2 as the program started with it: say() writes only there
  // (a program that closed it may have given the number to its own file).
  uint64_t stderr_dev, stderr_ino;
  bool job_dir_by_mount;  // P.job_dir is a mount's, found by its name: its stager must be alive
  // The process that owns this memory. A vfork child (Python's subprocess,
  // posix_spawn) runs in its parent's memory until it calls exec: it must
  // never change Monarch's state, which describes the parent's descriptors.
  std::atomic<pid_t> pid;
  char root[kPathMax];  // the dataset root as given, lexically normal
  size_t root_len;
  std::atomic<const Located*> located;  // never null once init_process succeeded
  // No map yet, and the dataset's paths here are not all known: opens of
  // absolute paths call seek_map(), which first finds the paths that show
  // the dataset's path given (early_done), or, where that is no directory
  // here (a container shows the dataset elsewhere), looks for the map, every
  // 50 ms at most, until one is found.
  std::atomic<bool> seeking;
  std::atomic<bool> early_done;
  std::atomic<uint64_t> next_seek_ns;
  char job_dir[kPathMax];
  char job_dirs[kMapTiers][kPathMax];  // each tier's as the environment gives it ("": not given)
  char job_mount_path[kPathMax];       // job_dir made lexically clean, for /proc/self/mountinfo
  char job_name[kPathMax];  // "monarch-<key>", the name of the job's directory on every tier
  std::atomic<JobMap*> map;
  std::atomic<uint64_t> next_load_ns;
  std::atomic<int> loading;
  std::atomic<int> fuse_noted;   // the job directory on FUSE was said once
  std::atomic<int> owner_noted;  // a map not the user's own was said once
  ino_t index_ino;
  std::atomic<int> hidden_noted;  // a tier or the dataset not visible here was said once
  sockaddr_un addr;
  socklen_t addr_len;
  // A hint: the current directory is in the dataset or above it. False makes
  // relative paths cost nothing; true makes them resolved with getcwd().
  std::atomic<bool> cwd_related;
  // The directories above the dataset root (and the root), and the symbolic
  // links its path goes through: a change to one of them moves the whole
  // dataset (set when the map is loaded).
  static constexpr int kAncestors = 64;
  struct Id {
    uint64_t dev, ino;
  } ancestors[kAncestors];
  std::atomic<int> ancestor_count;
  // The device of the dataset root as given, stat'ed before any map (0:
  // unknown): an open outside every view of a file on it may be a dataset
  // file reached through a path Monarch does not know (reached()).
  std::atomic<uint64_t> root_dev_hint;
  // Paths that reached a dataset file but whose root could not be made a
  // view (shadowed by a mount, no memory...): after kLearnTries, no more tries.
  static constexpr int kLearnTries = 16;
  std::atomic<int> learn_failed;
};
extern Process P;

// Is the calling process the one that owns Monarch's state? (See Process::pid.)
bool owner();

// The job map, loading it if it was not yet (rate-limited); null when none.
JobMap* current_map();
// After a stager restart: a new map replaces the old one (old descriptors keep theirs).
void reload_map();

// Logs one line to stderr when MONARCH_LOG is set. Never changes errno.
void note(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Says one line to stderr whatever MONARCH_LOG says: why Monarch cannot
// serve this process. Never changes errno.
void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Where `path`, relative to dirfd, leads, as the kernel would resolve it now.
// With `any_dirfd` a path relative to a directory descriptor is resolved too
// (through /proc/self/fd); otherwise such paths are kOutside.
Resolved where(int dirfd, const char* path, JobMap*& m, bool any_dirfd = false);

// After a successful chdir or fchdir: the current-directory hint again.
void on_chdir_done();

// The dataset root's views and the tiers' job directories here.
inline const Located& located() {
  return *P.located.load(std::memory_order_acquire);
}
// While P.seeking: finds the dataset's paths before its map, or looks for
// the map (at most every 50 ms).
void seek_map();

// Is `st` one of the directories or links the dataset root's path goes through?
bool root_ancestor(const struct stat& st);

// The descriptor number a magic name of the process's own descriptors names
// ("/proc/self/fd/N", "/proc/thread-self/fd/N", "/proc/<own pid>/fd/N",
// "/dev/fd/N", "/dev/stdin"...), or -1.
int magic_fd(const char* path);

// `fd` was opened through a name Monarch does not resolve (/proc/self/fd/N,
// /dev/fd/N...): if the kernel's name for it is one of the job's copies,
// returns its file and tier.
bool names_a_copy(int fd, JobMap*& m, uint32_t& file, uint32_t& tier);

// `path` is `root` or below it (`len` is root's length; 0 matches nothing).
inline bool has_prefix(const char* path, const char* root, size_t len) {
  return len && std::strncmp(path, root, len) == 0 && (path[len] == '/' || path[len] == 0);
}

// True when `path` (relative to dirfd) cannot name a dataset file: what the
// open wrappers test before anything else, so that other opens cost a prefix
// comparison per view (one or two outside containers). False does not mean
// it is one. Inline: it is most of what an open outside the
// dataset costs.
inline bool outside(int dirfd, const char* path) {
  if (!P.enabled || !path || !*path) return true;
  if (path[0] != '/')  // relative to a directory descriptor: not served
    return dirfd != AT_FDCWD ||
           (!P.cwd_related.load(std::memory_order_relaxed) && !std::strstr(path, ".."));
  if (P.seeking.load(std::memory_order_relaxed)) seek_map();
  const Located& l = located();
  if (P.map.load(std::memory_order_relaxed) && (path[1] == 'p' || path[1] == 'd') &&
      magic_fd(path) >= 0)
    return false;  // a copy?
  for (int i = 0; i < l.views; ++i)
    if (has_prefix(path, l.view[i], l.len[i])) return false;
  return true;
}

// After an open for reading outside every view succeeded (`r` is kOutside;
// `fd` from `path`, absolute or relative to the current directory): if `fd`
// is a regular file on a device of the dataset and the index holds its
// (device, inode), the path reached the dataset by a spelling Monarch did not
// know (a symbolic link outside the dataset, a bind mount made later). The
// prefix of `path` that is the dataset root, checked by identity, becomes a
// view (published in a new Located, while views are free), so later opens
// through it find copies, and `fd` is served as the PFS descriptor of that
// file (serve_opened). Costs one fstat an open while views are free, none
// once they are all taken. Never changes errno.
void reached(const Resolved& r, int dirfd, const char* path, int flags, int fd, bool stream);

// (open.cpp) `fd`, the caller's own PFS descriptor of dataset file `file`
// opened by `path` for reading: counted and tracked as an open of that file
// that found no copy is.
void serve_opened(JobMap* m, uint32_t file, int dirfd, const char* path, int fd, bool stream);

// True while an open outside every view may still reach the dataset by a
// path Monarch does not know (reached() can learn a view): the open wrappers
// then take the handler's path for such opens too, instead of the real call
// alone. Inline: it is what an open outside the dataset costs besides outside().
inline bool learning() {
  return P.enabled && P.learn_failed.load(std::memory_order_relaxed) < Process::kLearnTries &&
         (P.map.load(std::memory_order_relaxed) ||
          P.root_dev_hint.load(std::memory_order_relaxed)) &&
         located().views < kViews;
}

// Sets up the library from the environment (the constructor calls it; tests
// call it with their own values). `job_dirs`: kEnvJobDirs's value, or null.
// Returns false when Monarch stays off.
bool init_process(const char* dataset, const char* job_dir, bool log,
                  const char* job_dirs = nullptr);

}  // namespace monarch
