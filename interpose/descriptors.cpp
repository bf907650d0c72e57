// Descriptors made, copied and closed: the table follows the kernel's own
// descriptor table for every call that changes it and that Monarch can see.
// What it cannot see (a raw system call) is caught at use by identity().
// A vfork child changes only its own descriptor table, never its parent's:
// it leaves Monarch's state alone.
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "client.h"
#include "fdtable.h"
#include "handlers.h"
#include "process.h"
#include "serve.h"

namespace monarch {
namespace {

void untrack_range(unsigned first, unsigned last) {
  for_each_tracked([&](int fd, FdEntry* e) {
    if (unsigned(fd) >= first && unsigned(fd) <= last) untrack(e);
  });
}

// `to` is a new descriptor for the open file of `from` (dup, fcntl).
// A descriptor that can write, duplicated onto 0, 1 or 2, is written by
// stdio's stdin, stdout and stderr with glibc's own calls: a change now.
void follow_dup(int from, int to) {
  if (FdEntry* e = tracked(from)) {
    duplicate(e, to);
    if (to <= 2) changes(e);
  } else {
    untrack(to);
  }
}

// A descriptor that can write, closing: a write Monarch did not see through
// it (dprintf, aio_write, a raw system call, another process it was passed
// to) left the file's version other than the index's: a change.
void closing_writer(int fd, FdEntry* e) {
  struct stat st;
  if (e->writable && real::fstat(fd, &st) == 0 && !e->map->same_version(e->file, st)) changes(e);
}

}  // namespace

int on_close(int fd, Pass<int> pass) {
  if (FdEntry* e = tracked(fd); e && owner()) {
    KeepErrno k;
    closing_writer(fd, e);
    untrack(e);
  }
  return pass();
}

int on_fclose(FILE* f, Pass<int> pass) {
  int fd = f ? fileno(f) : -1;
  FdEntry* e = tracked(fd);
  if (e && owner()) {
    KeepErrno k;
    if (e->stream) {  // stdio reads are not seen: count what the stream consumed
      // At most the file: a stream seeked past its end read nothing there.
      off_t pos = real::lseek(fd, 0, SEEK_CUR);
      uint64_t end = pos > 0 ? std::min<uint64_t>(uint64_t(pos), e->map->entry(e->file).size) : 0;
      uint64_t n = end > e->stream_from ? end - e->stream_from : 0;
      if (n) count_read(e, Source::kStream, ssize_t(n));
    }
    untrack(e);
  }
  return pass();
}

FILE* on_fdopen(int fd, const char* mode, Pass<FILE*> pass) {
  FdEntry* e = tracked(fd);
  if (!e || !mode) return pass();
  // (Not the mode alone: "r" of a descriptor opened for reading and writing
  // cannot write through the stream, and "w" of one opened for reading fails.)
  if (mode[0] != 'r' || std::strchr(mode, '+')) {
    changes(e);
    return pass();
  }
  if (!owner()) return pass();
  FILE* f = pass();
  if (!f || !identity(fd, e)) return f;
  KeepErrno k;
  off_t pos = real::lseek(fd, 0, SEEK_CUR);
  e->stream = true;
  e->stream_from = pos > 0 ? uint64_t(pos) : 0;
  // A PFS descriptor's stream reads the PFS this time; its next open finds
  // the copy (a copy under way goes on).
  JobMap* m = e->map;
  if (e->kind.load() == kPfs && !e->placed && m->state(e->file).state == kNone &&
      m->stager_alive(monotonic_ns()) && !m->header().copies_off.load()) {
    e->placed = true;
    send(m, Request::kPlace, e->file);
  }
  return f;
}

int on_dup(int oldfd, Pass<int> pass) {
  int fd = pass();
  if (fd >= 0 && owner()) {
    KeepErrno k;
    follow_dup(oldfd, fd);
  }
  return fd;
}

int on_dup2(int oldfd, int newfd, Pass<int> pass) {
  int fd = pass();
  if (fd >= 0 && oldfd != newfd && owner()) {
    KeepErrno k;
    follow_dup(oldfd, fd);
  }
  return fd;
}

int on_fcntl(int fd, int cmd, void* arg, Pass<int> pass) {
  // O_NOATIME and leases are allowed by who owns the file: the copy is the
  // user's, the PFS file may not be. The PFS file says yes or no first.
  long a = reinterpret_cast<long>(arg);
  FdEntry* e = tracked(fd);
  if (e && e->kind.load() == kLocal &&
      ((cmd == F_SETFL && (a & O_NOATIME)) || (cmd == F_SETLEASE && a != F_UNLCK)) && owner() &&
      identity(fd, e)) {
    int pfd = open_pfs(e);
    if (pfd < 0) return -1;
    int r = real::fcntl(pfd, cmd, arg);
    KeepErrno k;
    if (r == 0 && cmd == F_SETLEASE) real::fcntl(pfd, F_SETLEASE, F_UNLCK);
    real::close(pfd);
    if (r < 0) return r;
  }
  int r = pass();
  // Only these change the table: the others (locks, F_GETFL, F_SETFD: what
  // SQLite calls on every query) cost no getpid.
  if (r < 0 || (cmd != F_DUPFD && cmd != F_DUPFD_CLOEXEC && cmd != F_SETFL) || !owner()) return r;
  KeepErrno k;
  if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) {
    follow_dup(fd, r);
  } else if (cmd == F_SETFL) {
    // With O_DIRECT the kernel's rules for the PFS file (alignment...) apply
    // to every read, which Monarch then makes on the PFS; F_SETFL sets all
    // the flags, so a later call without it clears it.
    // The flags belong to the open file: every duplicate of it changes too.
    bool direct = reinterpret_cast<long>(arg) & O_DIRECT;
    if (FdEntry* e = tracked(fd)) {
      uint32_t ofd = e->ofd;
      for_each_tracked([&](int, FdEntry* d) {
        if (d->ofd != ofd) return;
        if (direct) d->gave_up = true;
        d->direct = direct && d->kind.load() == kLocal;
      });
    }
  }
  return r;
}

int on_close_range(unsigned first, unsigned last, int flags, Pass<int> pass) {
  if (!(flags & CLOSE_RANGE_CLOEXEC) && owner()) untrack_range(first, last);
  return pass();
}

void on_closefrom(int lowfd, Pass<void> pass) {
  if (owner()) untrack_range(unsigned(lowfd < 0 ? 0 : lowfd), ~0u);
  pass();
}

int on_chdir(Pass<int> pass) {
  int r = pass();
  if (r == 0) {
    KeepErrno k;
    on_chdir_done();
  }
  return r;
}

}  // namespace monarch
