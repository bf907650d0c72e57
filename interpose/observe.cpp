// What a dataset path or a tracked descriptor looks like: the stat family
// answered from the index, and every other way a program can see a
// descriptor of a local copy (statx, /proc/self/fd, the calls that act on the
// file rather than read it) made to show the PFS file instead.
//
// A kPfs descriptor is the PFS's own: the kernel answers for it. Only kLocal
// descriptors, after identity() confirmed the table's claim, are answered
// here. statx of a path goes to the PFS: its fields (mount id, attributes,
// birth time) change with kernels and file systems, and an index cannot
// promise them; stat, lstat and fstatat, what readers call, are served.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "client.h"
#include "fdtable.h"
#include "handlers.h"
#include "process.h"
#include "serve.h"

namespace monarch {
namespace {

// A tracked descriptor of a local copy whose claim the kernel confirms.
FdEntry* local_copy(int fd) {
  FdEntry* e = tracked(fd);
  if (!e || e->kind.load() != kLocal || !P.enabled || !owner() || !identity(fd, e)) return nullptr;
  return e;
}

}  // namespace

int on_stat(int dirfd, const char* path, struct stat* st, int flags, Pass<int> pass) {
  if ((flags & AT_EMPTY_PATH) && (!path || !*path)) return on_fstat(dirfd, st, pass);
  // /proc/self/fd/N not followed is the link itself, the kernel's whatever the
  // descriptor opened (mode, size 64, the link's own inode): the call as made.
  if (int n = magic_fd(path); n >= 0 && local_copy(n)) {
    return flags & AT_SYMLINK_NOFOLLOW ? pass() : on_fstat(n, st, pass);
  }
  if (flags & ~(AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT)) return pass();
  JobMap* m;
  Resolved r = where(dirfd, path, m);  // (safe in a vfork child: it loads no map there)
  if (r.where != Where::kFile || !owner()) return pass();
  if (m->consistency() == 1 || m->state(r.id).state == kStale || !m->fill_stat(r.id, st)) {
    add(m, c_stat_pfs);  // counters never touch errno: the pass's errno is the caller's
    return pass();
  }
  add(m, c_stat_index);
  return 0;
}

int on_fstat(int fd, struct stat* st, Pass<int> pass) {
  FdEntry* e = local_copy(fd);
  if (!e) return pass();
  JobMap* m = e->map;
  uint32_t w = m->entry(e->file).state.load(std::memory_order_relaxed);
  bool unchanged = state_of(w) != kStale, renamed = !unchanged && (aux_of(w) & kNamesOnly);
  // The copy was opened from the version the index holds (under consistency =
  // open too): the index describes it, even once its name has moved.
  if ((renamed || unchanged) && m->fill_stat(e->file, st)) {
    add(m, c_stat_index);
    return 0;
  }
  // Changed by the job, or not answerable from the index: the PFS file's.
  char path[2 * kPathMax];
  if (!pfs_path(m, e->file, path, sizeof path)) return pass();
  add(m, c_stat_pfs);
  return real::stat(path, st);
}

int on_statx(int fd, const char* path, int flags, unsigned mask, struct statx* stx, Pass<int> pass,
             PassFd<int> on_fd) {
  if ((flags & AT_EMPTY_PATH) && (!path || !*path)) {
  } else if (int n = magic_fd(path); n >= 0 && !(flags & AT_SYMLINK_NOFOLLOW)) {
    fd = n;  // /proc/self/fd/N followed: the descriptor itself (not followed: the link's own)
  } else {
    return pass();
  }
  FdEntry* e = local_copy(fd);
  if (!e) return pass();
  int pfd = open_pfs(e);
  if (pfd < 0) return -1;
  // The PFS descriptor itself: the caller's path (/proc/self/fd/N, absolute)
  // would name the copy again whatever the directory descriptor.
  int r = real::statx(pfd, "", AT_EMPTY_PATH | (flags & AT_STATX_SYNC_TYPE), mask, stx);
  (void)on_fd;
  KeepErrno k;
  real::close(pfd);
  return r;
}

ssize_t on_readlink(int dirfd, const char* path, char* buf, size_t size, Pass<ssize_t> pass) {
  int fd = magic_fd(path);
  FdEntry* e = fd >= 0 && size > 0 ? local_copy(fd) : nullptr;
  if (!e) return pass();
  // The kernel names the PFS file by the path of the mount it was opened
  // through: the view the program named it through, resolved.
  const Located& l = located();
  if (!l.views) return pass();
  int v = e->view < l.views ? e->view : l.pfs;
  std::string_view rel = e->map->path(e->file);
  char name[2 * kPathMax];
  int n = std::snprintf(name, sizeof name, "%s/%.*s", l.real[v], int(rel.size()), rel.data());
  if (n <= 0 || size_t(n) >= sizeof name) return pass();
  size_t len = std::min<size_t>(size_t(n), size);
  std::memcpy(buf, name, len);
  return ssize_t(len);
}

template <typename R>
R on_pfs_call(int fd, bool changes, PassFd<R> call, Pass<R> pass) {
  FdEntry* e = tracked(fd);
  if (!e || !owner() || e->kind.load() == kPfs) {
    if (e && changes && e->kind.load() == kPfs) {
      KeepErrno k;
      mark_stale(e->map, e->file);
    }
    R r = pass();
    if (changes && !e && r >= 0) {  // any descriptor of a dataset file, opened some other way
      KeepErrno k;
      JobMap* m = P.map.load();
      struct stat st;
      if (m && real::fstat(fd, &st) == 0) mark_stale_inode(m, st);
    }
    return r;
  }
  if (!identity(fd, e)) return pass();
  if (changes) mark_stale(e->map, e->file);
  int pfd = open_pfs(e);
  if (pfd < 0) return R(-1);
  R r = call(pfd);
  KeepErrno k;
  real::close(pfd);
  return r;
}
template int on_pfs_call<int>(int, bool, PassFd<int>, Pass<int>);
template ssize_t on_pfs_call<ssize_t>(int, bool, PassFd<ssize_t>, Pass<ssize_t>);

ssize_t on_transfer(int fd_in, const off_t* at, PassFd<ssize_t> call, Pass<ssize_t> pass) {
  FdEntry* e = local_copy(fd_in);
  if (!e) return pass();
  // The kernel decides what a transfer from the PFS file does (EXDEV across
  // file systems, O_DIRECT's rules...): make it from the PFS file, at this
  // descriptor's offset.
  int pfd = open_pfs(e, e->direct ? O_DIRECT : 0);
  if (pfd < 0) return pass();
  off_t pos = at ? 0 : real::lseek(fd_in, 0, SEEK_CUR);
  ssize_t r = -1;
  if (pos >= 0 && (at || real::lseek(pfd, pos, SEEK_SET) == pos)) {
    r = call(pfd);
    KeepErrno k;
    if (!at && r > 0) real::lseek(fd_in, pos + r, SEEK_SET);
  }
  KeepErrno k;
  real::close(pfd);
  return r;
}

}  // namespace monarch
