// Opening dataset files, and every call that may change one.
//
// An open of an indexed dataset file for reading gets, decided once:
//   cached         a descriptor of the local copy, opened with the caller's flags
//   small, free    its own PFS descriptor; the file is read whole from it at
//                  once (one request instead of several) into memory that
//                  serves this descriptor's reads, and the memory and the
//                  descriptor itself go to the stager, which checks that the
//                  descriptor is the indexed version before it writes the copy
//   otherwise      its own PFS descriptor (kPfs; read.cpp serves its reads)
// A small file another process is reading whole or the stager is copying is
// waited for, at most the stall timeout from the moment that work last
// moved (not from the moment this opener came): a stuck claim or copy stops
// every later opener from waiting at all.
//
// An open for reading and writing of an indexed dataset file (O_RDWR, with
// or without O_CREAT; not O_APPEND or O_TRUNC: sqlite3.connect, lmdb.open)
// leaves the file as it is until a call through that open file may change
// it (changes(): write, pwrite, writev, ftruncate, fallocate, a transfer into
// it, a stream that writes, a duplicate onto descriptor 0, 1 or 2, a shared
// mapping), or until it closes having changed (a write Monarch did not see:
// dprintf, aio_write, a raw system call): the file is stale from then on.
// Write-only and O_APPEND opens are changes at once: they are made to write,
// often with glibc's own calls (a shell's `>>` and its builtin echo write
// through stdio), which Monarch never sees. The program holds its own PFS descriptor
// (kPfs); opened for reading and writing, its reads are served from the copy
// as an open for reading's are. A program started by exec that inherits
// such a descriptor marks its file stale when it starts (process.cpp:
// its table does not know the descriptor, whose writes it would not see).
//
// Changes: any other open for writing, wherever its path points (a link,
// another name of the same inode), and any call that changes a file or
// directory marks what it changed stale in the job map before the caller
// sees the call return, by the identity (device, inode) the kernel reports
// for it.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "client.h"
#include "fdtable.h"
#include "handlers.h"
#include "process.h"
#include "serve.h"

namespace monarch {
namespace {

bool writes(int flags) {
  return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
}

// An open for writing that is a change only once it writes (see above).
// Not O_TRUNC (it changes the file at once), O_EXCL (an existing file
// fails), O_PATH, O_DIRECTORY, O_TMPFILE, O_DIRECT, O_NOATIME (not served
// for reading either).
bool writes_later(int flags) {
  return (flags & O_ACCMODE) == O_RDWR &&
         !(flags & (O_APPEND | O_TRUNC | O_EXCL | O_PATH | O_DIRECTORY | O_DIRECT | O_NOATIME)) &&
         (flags & O_TMPFILE) != O_TMPFILE;
}

// The map to mark changes in: loaded already, or loaded now by the owner (a
// vfork child may mark the shared map but never loads one into its parent).
JobMap* map_for_changes() {
  JobMap* m = P.map.load(std::memory_order_acquire);
  return m || !P.enabled || !owner() ? m : current_map();
}

// After an open for writing succeeded: the file it opened is stale, if it is
// a dataset file. Done before the caller sees the descriptor.
void opened_for_writing(int fd) {
  JobMap* m = map_for_changes();
  struct stat st;
  if (m && real::fstat(fd, &st) == 0) mark_stale_inode(m, st);
}

// After an open for writing (open or fopen): whether the kernel opened a
// copy, through a name of a copy's descriptor in whatever spelling
// (/proc/self/task/T/fd/N, openat on /proc/self/fd...). The write belongs to
// the PFS file: the file is marked stale and its path put in `pfs` ("" when
// it does not fit); the caller opens it instead, before its caller sees the
// copy. Judged by what the descriptor is, not by its name.
bool opened_a_copy(int fd, char (&pfs)[2 * kPathMax]) {
  JobMap* m;
  uint32_t file, tier;
  if (fd < 0 || !owner() || !names_a_copy(fd, m, file, tier)) return false;
  mark_stale(m, file);
  if (!pfs_path(m, file, pfs, sizeof pfs)) pfs[0] = 0;
  return true;
}

int write_reaches_pfs(int fd, int flags, mode_t mode) {
  char pfs[2 * kPathMax];
  if (!opened_a_copy(fd, pfs)) return fd;
  real::close(fd);
  if (!pfs[0]) return errno = ENAMETOOLONG, -1;
  return real::open(pfs, flags & ~(O_NOFOLLOW | O_CREAT | O_EXCL), mode);
}

// Before a call that changes what `path` names: that file or directory is stale.
void changing(int dirfd, const char* path, bool follow, bool names) {
  JobMap* m = map_for_changes();
  struct stat st;
  if (!m || !path || real::fstatat(dirfd, path, &st, follow ? 0 : AT_SYMLINK_NOFOLLOW) != 0) return;
  if ((S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode)) &&
      root_ancestor(st)) {  // moving an ancestor moves every name
    note("a directory above the dataset changes (%s): every name is stale", path);
    return mark_stale_dir(m, kRoot, Change::kNames);
  }
  mark_stale_inode(m, st, names ? Change::kNames : Change::kBytes);
}

// Opens the copy of `file` on `tier` with the caller's flags, tracked; -1 when
// it cannot (the caller then opens the PFS file).
int open_copy(JobMap* m, uint32_t file, uint32_t tier, int flags, uint8_t view) {
  char path[2 * kPathMax + 64];
  if (!copy_path(m, file, tier, path, sizeof path)) return -1;
  int fd = real::open(path, flags);
  if (fd < 0) {
    note("cannot open the copy %s: %s; reading from the PFS", path, std::strerror(errno));
    add(m, c_fb_error);
    return -1;
  }
  struct stat st;
  FdEntry* e = fd < kTableLimit && real::fstat(fd, &st) == 0 ? track(fd, m, file, kLocal) : nullptr;
  if (!e) {  // a descriptor Monarch could not describe as the PFS's: the PFS serves it
    real::close(fd);
    return -1;
  }
  e->tier = uint8_t(tier);
  e->view = view;
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  add(m, c_tier_opens + tier);
  touch(m, file);
  return fd;
}

bool stuck(const JobMap* m, const State& s, uint64_t now) {
  if (s.state == kClaimed) return coarse_age_ns(s.aux, coarse_now()) > m->stall_ns();
  if (s.state == kQueued) return m->queue_stuck(coarse_age_ns(s.aux, coarse_now()), now);
  if (s.state == kCopying) {
    CopySlot* cs = m->copy_slot(s.aux);
    return !cs || cs->stalled(now, m->stall_ns());
  }
  return false;
}

// A small file someone else is reading whole or copying: its state once that
// work is done, or kFailed when it is stuck (judged from the work's own stamps).
State wait_small(JobMap* m, uint32_t file) {
  uint64_t start = monotonic_ns();
  for (int round = 0;; ++round) {
    State s = m->state(file);
    if (s.state != kClaimed && s.state != kQueued && s.state != kCopying) return s;
    uint64_t now = monotonic_ns();
    if (!m->stager_alive(now) || stuck(m, s, now) || now - start > m->stall_ns()) {
      add(m, c_fb_wait);
      return State{};
    }
    backoff(round);
  }
}

// Reads the small file `file` whole from `fd` (ours, just opened) and hands
// the bytes and the descriptor to the stager. The bytes then serve `e`.
void read_whole(JobMap* m, uint32_t file, int fd, FdEntry* e) {
  uint64_t size = m->entry(file).size;
  // A memory file larger than RLIMIT_FSIZE raises SIGXFSZ: such a file is
  // left to the stager.
  rlimit rl;
  if (getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && size >= rl.rlim_cur)
    return;
  uint32_t word;
  if (!claim(m, file, word)) return;
  // Only the version the index holds is handed over (the stager checks again).
  if (!identity(fd, e) || e->gave_up) return release(m, file, word);
  int mfd = int(syscall(SYS_memfd_create, "monarch", MFD_CLOEXEC));
  char* data = nullptr;
  bool ok = mfd >= 0 && ftruncate(mfd, off_t(size)) == 0 &&
            (size == 0 || fallocate(mfd, 0, 0, off_t(size)) == 0);
  if (ok && size) {
    void* p = real::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    ok = p != MAP_FAILED;
    if (ok) data = static_cast<char*>(p);
  }
  // One request reads the bytes and finds the end: it asks one byte more than
  // the indexed size (into `eof`), and a read of a regular file that returns
  // less than it asked has reached the end. A second request to see the end
  // (what `read` loops do) costs a PFS round trip a file: 2,000 ms of the
  // issue 11 workload's 2,000 small files, a quarter of them a reader.
  uint64_t got = 0, t0 = monotonic_ns();
  while (ok) {
    char eof;
    iovec v[2] = {{data + got, size - got}, {&eof, 1}};
    ssize_t r =
        got < size ? real::preadv(fd, v, 2, off_t(got)) : real::pread(fd, &eof, 1, off_t(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) ok = false;
    if (r < 0) break;
    add(m, c_pfs_reads);
    add(m, c_pfs_bytes, r);
    got += r;
    if (got > size) ok = false;  // grew since it was indexed
    if (r == 0 || got >= size) break;
  }
  add(m, c_pfs_read_ns, monotonic_ns() - t0);
  if (ok && got != size) ok = false;
  int fds[2] = {mfd, fd};
  if (ok && send(m, Request::kData, file, fds, 2)) {
    add(m, c_handoffs);
    add(m, c_handoff_bytes, size);
  } else {
    release(m, file, word);
  }
  if (mfd >= 0) real::close(mfd);
  if (!ok) {
    if (data) munmap(data, size);
    if (got != size) e->gave_up = true;  // not the indexed bytes: the PFS serves this descriptor
    return;
  }
  e->whole = make_whole(data, size);
  if (!e->whole) munmap(data, size), e->gave_up = true;
}

// What an open for reading of `file` finds: counted, compared with the PFS
// under consistency = open, and waited for when a small file's copy is
// under way. `failed`: the comparison's stat failed (the open will say why).
State open_state(JobMap* m, uint32_t file, int dirfd, const char* path, bool& failed) {
  add(m, c_opens);
  add(m, c_pass_opens + file % kPassBuckets);  // what tells passes from re-reads (stats.cpp)
  failed = false;
  State s = m->state(file);
  if (m->consistency() == 1 && s.state != kStale) {  // the PFS file is compared at every open
    struct stat st;
    add(m, c_stat_pfs);
    if (real::fstatat(dirfd, path, &st, 0) != 0) {
      failed = true;
      return s;
    }
    if (!m->same_version(file, st)) {
      mark_stale(m, file);
      s = m->state(file);
    }
  }
  bool small = m->entry(file).size <= m->small_file_max();
  if (small && m->stager_alive(monotonic_ns()) && !m->header().copies_off.load() &&
      (s.state == kClaimed || s.state == kQueued || s.state == kCopying))
    s = wait_small(m, file);
  return s;
}

// After the PFS file was opened as `fd`: tracked, and read whole or left to
// the copy. False when it cannot be tracked (above the table's limit).
bool opened_pfs(JobMap* m, uint32_t file, const State& s, int fd, bool stream,
                bool writable = false) {
  add(m, c_pfs_opens);
  FdEntry* e = track(fd, m, file, kPfs);
  if (!e) return false;
  e->stream = stream;
  e->writable = writable;
  bool alive = m->stager_alive(monotonic_ns());
  if (!alive) {
    add(m, c_fb_no_stager);
    reload_map();  // a restarted stager publishes a new map
  }
  bool copies = alive && !m->header().copies_off.load(std::memory_order_relaxed);
  // No room here, in a multi-node job: read.cpp reads it from another node.
  bool peer = s.state == kNoRoom && m->header().peer_reads.load(std::memory_order_relaxed);
  // Cached: a reader opened the copy instead, unless its open failed; a
  // descriptor opened for reading and writing is served from it.
  bool coming = s.state == kNone || s.state == kQueued || s.state == kCopying;
  if (!copies || stream || !(coming || peer || (writable && s.state == kCached))) {
    e->gave_up = true;  // no copy will serve it: counted, read from the PFS
    // A stream reads the PFS this time (stdio's buffer is not Monarch's to
    // fill), and asks for the copy its next open will find.
    if (copies && stream && s.state == kNone) send(m, Request::kPlace, file);
    return true;
  }
  if (m->entry(file).size <= m->small_file_max() && s.state == kNone) read_whole(m, file, fd, e);
  return true;
}

// An open for reading of the indexed dataset file `file`.
int open_file(JobMap* m, const Resolved& r, int dirfd, const char* path, int flags,
              Pass<int> pass) {
  uint32_t file = r.id;
  bool failed;
  State s = open_state(m, file, dirfd, path, failed);
  if (failed) return pass();
  if (s.state == kCached) {
    int fd = open_copy(m, file, s.tier, flags, r.view);
    if (fd >= 0) return fd;
  }
  int fd = pass();
  if (fd < 0) return fd;
  KeepErrno k;
  opened_pfs(m, file, s, fd, false);
  return fd;
}

// An open for reading and writing of the indexed dataset file r.id that is
// a change only once it writes (writes_later): the program's own PFS
// descriptor, tracked as one that can write, served as an open for reading
// is. One that cannot be tracked, or whose comparison with the PFS failed,
// is a change now.
int open_writer(JobMap* m, const Resolved& r, int dirfd, const char* path, int flags,
                Pass<int> pass) {
  bool failed;
  State s = open_state(m, r.id, dirfd, path, failed);
  int fd = pass();
  if (fd < 0) return fd;
  KeepErrno k;
  if (failed || !opened_pfs(m, r.id, s, fd, false, true)) {
    untrack(fd);
    opened_for_writing(fd);
  }
  return fd;
}

}  // namespace

void changes(FdEntry* e) {
  if (!e->writable) return;  // the kernel refuses the change (EBADF, EINVAL)
  KeepErrno k;
  // Every name of the inode (hard links), as an open for writing marks them.
  JobMap* m = e->map;
  const Attr* a = m->attr(e->file);
  struct stat st {};
  st.st_mode = S_IFREG;
  st.st_dev = a ? dev_t(a->dev) : 0;
  st.st_ino = ino_t(m->entry(e->file).ino);
  if (a) mark_stale_inode(m, st);
  mark_stale(m, e->file);
}

int on_open(int dirfd, const char* path, int flags, mode_t mode, Pass<int> pass) {
  // A name of a copy's descriptor (/proc/self/fd/N) opened for reading: the
  // kernel opens the copy, which holds the PFS file's bytes: tracked as one.
  // (Opened for writing: write_reaches_pfs, whatever the spelling.)
  if (int n = magic_fd(path); n >= 0 && !writes(flags) && owner()) {
    FdEntry* e = tracked(n);
    if (e && e->kind.load() == kLocal && identity(n, e)) {
      int fd = pass();
      if (fd >= 0) {
        KeepErrno k;
        track_copy(fd, false);
      }
      return fd;
    }
  }
  if (writes_later(flags) && P.enabled && owner()) {
    JobMap* m;
    Resolved r = where(dirfd, path, m);
    if (r.where == Where::kFile) return open_writer(m, r, dirfd, path, flags, pass);
  }
  if (writes(flags)) {
    int fd = write_reaches_pfs(pass(), flags, mode);
    if (fd >= 0) {
      KeepErrno k;
      opened_for_writing(fd);
      if (owner()) untrack(fd);
    }
    return fd;
  }
  if (!owner()) return pass();  // a vfork child: nothing of Monarch's state is its own
  JobMap* m;
  Resolved r = where(dirfd, path, m);
  if (r.where != Where::kFile ||
      (flags & (O_CREAT | O_PATH | O_DIRECTORY | O_DIRECT | O_NOATIME)) ||
      (flags & O_TMPFILE) == O_TMPFILE) {
    int fd = pass();
    if (fd >= 0) untrack(fd);  // a number reused behind Monarch's back
    if (fd >= 0) reached(r, dirfd, path, flags, fd, false);  // a dataset file by another path?
    return fd;
  }
  return open_file(m, r, dirfd, path, flags, pass);
}

void serve_opened(JobMap* m, uint32_t file, int dirfd, const char* path, int fd, bool stream) {
  bool failed;
  State s = open_state(m, file, dirfd, path, failed);
  if (!failed) opened_pfs(m, file, s, fd, stream);
}

FILE* on_fopen(const char* path, const char* mode, Pass<FILE*> pass) {
  if (!mode || mode[0] != 'r' || std::strchr(mode, '+')) {  // writes: the file is stale
    FILE* f = pass();
    char pfs[2 * kPathMax];
    if (f && opened_a_copy(fileno(f), pfs)) {
      real::fclose(f);
      f = pfs[0] ? real::fopen(pfs, mode) : (errno = ENAMETOOLONG, nullptr);
    }
    if (f) {
      KeepErrno k;
      opened_for_writing(fileno(f));
      if (owner()) untrack(fileno(f));
    }
    return f;
  }
  if (!owner()) return pass();
  JobMap* m;
  Resolved r = where(AT_FDCWD, path, m);
  if (r.where != Where::kFile) {
    FILE* f = pass();
    if (f) untrack(fileno(f));
    if (f)
      reached(r, AT_FDCWD, path, O_RDONLY, fileno(f), true);  // a dataset file by another path?
    return f;
  }
  // The stream itself is glibc's own, made by its fopen (flags, close-on-exec,
  // what freopen keeps), on the copy or on the PFS file.
  bool failed;
  State s = open_state(m, r.id, AT_FDCWD, path, failed);
  if (!failed && s.state == kCached) {
    char copy[2 * kPathMax + 64];
    FILE* f = copy_path(m, r.id, s.tier, copy, sizeof copy) ? real::fopen(copy, mode) : nullptr;
    struct stat st;
    FdEntry* e = f && fileno(f) < kTableLimit && real::fstat(fileno(f), &st) == 0
                     ? track(fileno(f), m, r.id, kLocal)
                     : nullptr;
    if (e) {
      e->tier = uint8_t(s.tier);
      e->view = r.view;
      e->dev = st.st_dev;
      e->ino = st.st_ino;
      e->stream = true;
      add(m, c_tier_opens + s.tier);
      touch(m, r.id);
      return f;
    }
    if (f) real::fclose(f);
    add(m, c_fb_error);
  }
  FILE* f = pass();
  if (f && !failed) {
    KeepErrno k;
    opened_pfs(m, r.id, s, fileno(f), true);
  }
  return f;
}

FILE* on_freopen(const char* path, const char* mode, FILE* stream, Pass<FILE*> pass) {
  // glibc closes and opens the descriptor inside: Monarch sees neither.
  // freopen(NULL, ...) reopens the stream's own file through /proc/self/fd:
  // for a copy's stream, the PFS file is that file.
  char pfs[2 * kPathMax];
  FdEntry* e = stream && owner() ? tracked(fileno(stream)) : nullptr;
  if (!path && e && e->kind.load() == kLocal && identity(fileno(stream), e) &&
      pfs_path(e->map, e->file, pfs, sizeof pfs)) {
    untrack(fileno(stream));
    return real::freopen(pfs, mode, stream);  // the handler of the new path: none needed
  }
  if (stream && owner()) untrack(fileno(stream));
  FILE* f = pass();
  if (f && mode && (mode[0] != 'r' || std::strchr(mode, '+'))) {
    KeepErrno k;
    opened_for_writing(fileno(f));
  }
  return f;
}

int on_spawn_open(const char* path, int flags, Pass<int> pass) {
  if (writes(flags)) {
    KeepErrno k;
    changing(AT_FDCWD, path, !(flags & O_NOFOLLOW), false);
  }
  return pass();
}

int on_change(int dirfd, const char* path, bool follow, bool names, Pass<int> pass) {
  {
    KeepErrno k;
    changing(dirfd, path, follow, names);
  }
  return pass();
}

int on_change2(int dirfd, const char* path, int dirfd2, const char* path2, bool names,
               Pass<int> pass) {
  {
    KeepErrno k;
    changing(dirfd, path, false, names);
    changing(dirfd2, path2, false, names);
  }
  return pass();
}

}  // namespace monarch
