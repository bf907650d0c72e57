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

namespace monarch {

struct Process {
  bool enabled;  // the job's environment names a dataset and a job directory
  bool log;
  // The process that owns this memory. A vfork child (Python's subprocess,
  // posix_spawn) runs in its parent's memory until it calls exec: it must
  // never change Monarch's state, which describes the parent's descriptors.
  std::atomic<pid_t> pid;
  char root[kPathMax];  // the dataset root as given, lexically normal
  size_t root_len;
  char real_root[kPathMax];  // from the job map, once loaded
  std::atomic<size_t> real_len;
  std::atomic<bool> real_differs;  // real_root is not root: a path may start with either
  char job_dir[kPathMax];
  char job_mount_path[kPathMax];  // job_dir made lexically clean, for /proc/self/mountinfo
  char job_name[kPathMax];        // "monarch-<key>", the name of the job's directory on every tier
  std::atomic<JobMap*> map;
  std::atomic<uint64_t> next_load_ns;
  std::atomic<int> loading;
  std::atomic<int> fuse_noted;   // the job directory on FUSE was said once
  std::atomic<int> owner_noted;  // a map not the user's own was said once
  ino_t index_ino;
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

// Where `path`, relative to dirfd, leads, as the kernel would resolve it now.
// With `any_dirfd` a path relative to a directory descriptor is resolved too
// (through /proc/self/fd); otherwise such paths are kOutside.
Resolved where(int dirfd, const char* path, JobMap*& m, bool any_dirfd = false);

// After a successful chdir or fchdir: the current-directory hint again.
void on_chdir_done();

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
// comparison (two where the real root differs from the root as given). False
// does not mean it is one. Inline: it is most of what an open outside the
// dataset costs.
inline bool outside(int dirfd, const char* path) {
  if (!P.enabled || !path || !*path) return true;
  if (path[0] != '/')  // relative to a directory descriptor: not served
    return dirfd != AT_FDCWD ||
           (!P.cwd_related.load(std::memory_order_relaxed) && !std::strstr(path, ".."));
  size_t rl = P.real_len.load(std::memory_order_acquire);  // real_root and real_differs with it
  if (rl && (path[1] == 'p' || path[1] == 'd') && magic_fd(path) >= 0) return false;  // a copy?
  return !has_prefix(path, P.root, P.root_len) &&
         !(P.real_differs.load(std::memory_order_relaxed) && has_prefix(path, P.real_root, rl));
}

// Sets up the library from the environment (the constructor calls it; tests
// call it with their own values). Returns false when Monarch stays off.
bool init_process(const char* dataset, const char* job_dir, bool log);

}  // namespace monarch
