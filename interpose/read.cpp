// Reads of tracked descriptors (see fdtable.h for the two kinds).
// (In a multi-node job, a file this node has no room for is read from
// another node through the stager: client.h, peer_read.)
//
// kLocal: native reads of the copy (the wrappers do 63 of 64 inline; the 64th
// is timed here for the local read rate). Once the job has changed the file,
// its reads are made on the PFS file at this descriptor's own offset.
//
// kPfs: the descriptor is the program's own PFS descriptor. Its reads are
// served, at the call, from the bytes read whole at open, or from the copy
// (the part already written, then the finished copy), when
//   - the descriptor still is the dataset file in the indexed version
//     (identity(), on the kernel's cached attributes): one open never mixes
//     two versions, and a reused descriptor number is never served;
//   - for read() and readv(), which move the offset: the open file is this
//     descriptor's alone (not dup'd, not inherited by a fork or an exec), so
//     that the offset Monarch reads and writes back cannot move in between;
//     otherwise read() goes to the PFS, atomically, as the kernel does it.
// A copy that has made no progress for the stall timeout (judged from the
// copy's own progress stamp, so a stuck copy stops every reader from waiting)
// sends the read to the PFS; later reads use the copy if it moved again. No
// call waits longer than that.
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
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

// How far ahead of a copy's progress a read may start and still wait for it
// rather than read the PFS (about 20 ms of a copy at 400 MB/s). A reader at
// the copy's front waits: reading the same bytes from the PFS in parallel is
// what made the original Monarch read 36-48% of the dataset twice.
constexpr uint64_t kWaitWindow = 8 << 20;

size_t total(const iovec* iov, int cnt) {
  size_t n = 0;
  for (int i = 0; i < cnt; ++i) n += iov[i].iov_len;
  return n;
}

// A read made on the PFS by the caller's own call, counted.
ssize_t read_pass(FdEntry* e, Pass<ssize_t> pass) {
  uint64_t t0 = monotonic_ns();
  ssize_t r = pass();
  KeepErrno k;
  count_read(e, Source::kPfs, r, monotonic_ns() - t0);
  return r;
}

ssize_t read_local(FdEntry* e, Pass<ssize_t> pass) {
  uint64_t t0 = monotonic_ns();
  ssize_t r = pass();
  KeepErrno k;
  count_read(e, Source::kLocal, r, monotonic_ns() - t0 + 1);
  return r;
}

// The position a read starts at, and, for read(), the move of the offset once
// it is done. Holds the entry's lock for read(): threads of this process
// sharing the descriptor number see reads one after the other, and the
// thread is not cancelled meanwhile (NoCancel).
class Position {
 public:
  Position(int fd, FdEntry* e, off_t off, bool positional)
      : fd_(fd), e_(e), positional_(positional), no_cancel_(!positional, true) {
    if (positional) {
      pos_ = off;
    } else {
      // No signal handler may read this descriptor between the offset read
      // here and the one written back: a read() is one step, as in the kernel.
      // (sigprocmask sets the calling thread's mask, as pthread_sigmask does,
      // whose default version is glibc 2.32's.)
      sigset_t all;
      sigfillset(&all);
      for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP}) sigdelset(&all, s);
      sigprocmask(SIG_BLOCK, &all, &saved_);
      while (e->lock.test_and_set(std::memory_order_acquire)) sched_yield();
      locked_ = true;
      pos_ = real::lseek(fd, 0, SEEK_CUR);
    }
  }
  ~Position() {
    if (!locked_) return;
    e_->lock.clear(std::memory_order_release);
    sigprocmask(SIG_SETMASK, &saved_, nullptr);
  }
  bool ok() const { return pos_ >= 0; }
  uint64_t at() const { return uint64_t(pos_); }
  // The read returned r bytes: a read() moves the offset past them.
  bool advance(ssize_t r) {
    return positional_ || r <= 0 || real::lseek(fd_, pos_ + r, SEEK_SET) >= 0;
  }

 private:
  int fd_;
  FdEntry* e_;
  bool positional_, locked_ = false;
  off_t pos_;
  sigset_t saved_;
  NoCancel no_cancel_;
};

// Copies [pos, size) of `data` into the caller's vector, as far as it goes,
// through the kernel (process_vm_writev into our own process): a bad buffer
// is EFAULT as a read would say, never a SIGSEGV of ours. -2 when the kernel
// refuses (the caller then reads the PFS, which answers for the buffer).
ssize_t scatter(const char* data, uint64_t size, uint64_t pos, const iovec* iov, int cnt) {
  if (pos >= size) return 0;
  iovec from{const_cast<char*>(data) + pos, size - pos};
  ssize_t r =
      process_vm_writev(P.pid.load(std::memory_order_relaxed), &from, 1, iov, unsigned(cnt), 0);
  return r < 0 ? -2 : r;
}

// The calls the kernel refuses before reading anything: Monarch passes them
// through so that the kernel says why (EINVAL, EFAULT), as it would.
bool kernel_refuses(const iovec* iov, int cnt, off_t off, bool positional) {
  if (cnt < 0 || cnt > IOV_MAX) return true;
  uint64_t sum = 0;
  for (int i = 0; i < cnt; ++i) {
    if (iov[i].iov_len > uint64_t(SSIZE_MAX) - sum) return true;
    sum += iov[i].iov_len;
  }
  return positional && (off < 0 || uint64_t(off) > uint64_t(LLONG_MAX) - sum);
}

enum class Wait { kCopy, kPartial, kPeer, kPfs };

// Waits until [pos, end) can be read from the file's copy; kPfs when it
// cannot in time. `tier` and `slot` say where the copy is.
Wait wait_copy(FdEntry* e, uint64_t pos, uint64_t end, uint32_t& tier, uint32_t& slot) {
  JobMap* m = e->map;
  uint64_t start = monotonic_ns(), stall = m->stall_ns();
  for (int round = 0;; ++round) {
    State s = m->state(e->file);
    uint64_t now = monotonic_ns();
    if (s.state == kCached) {
      tier = s.tier;
      return Wait::kCopy;
    }
    if (!m->stager_alive(now)) {
      add(m, c_fb_no_stager);
      e->gave_up = true;
      return Wait::kPfs;
    }
    if (m->header().copies_off.load(std::memory_order_relaxed)) {  // the PFS is as fast
      e->gave_up = true;
      return Wait::kPfs;
    }
    bool working = s.state == kNone || s.state == kQueued || s.state == kCopying;
    // No room on this node, in a multi-node job: another node has it.
    if (s.state == kNoRoom && m->header().peer_reads.load(std::memory_order_relaxed))
      return Wait::kPeer;
    if (!working) {  // no room, failed, stale: the PFS it is
      e->gave_up = true;
      return Wait::kPfs;
    }
    // Ask once per descriptor: for a file nobody copies yet, and for a
    // background copy, which then goes before the backlog (or resumes if paused).
    if (!e->placed) {
      e->placed = true;
      if (!send(m, Request::kPlace, e->file) && s.state == kNone) {
        e->gave_up = true;
        return Wait::kPfs;
      }
    }
    bool stuck = false, copy_stalled = false;
    if (s.state == kQueued) stuck = m->queue_stuck(coarse_age_ns(s.aux, coarse_now()), now);
    if (s.state == kCopying) {
      CopySlot* cs = m->copy_slot(s.aux);
      if (!cs || cs->file.load(std::memory_order_acquire) != e->file + 1) {
        stuck = now - start > stall;  // a word naming a slot that is not this copy's
      } else {
        uint64_t progress = cs->progress.load(std::memory_order_acquire);
        if (end <= progress) {
          tier = s.tier;
          slot = s.aux;
          return Wait::kPartial;
        }
        if (pos > progress + kWaitWindow) return Wait::kPfs;  // far ahead: cheaper to read it
        stuck = copy_stalled = cs->stalled(now, stall);
      }
    }
    // A copy that moves is waited for; one that does not, or a request the
    // stager does not take up, at most the stall timeout.
    if (s.state == kNone) stuck = m->queue_stuck(now - start, now);
    if (stuck) {
      add(m, c_fb_wait);
      // A copy that stopped moving: this read goes to the PFS, and later
      // ones look again (a copy stuck for good is seen at once by its old
      // stamp, so they do not wait; one that moves again serves them, where
      // giving up for good read the rest of the file twice). A request the
      // stager does not take up: this descriptor does not wait again.
      if (!copy_stalled) e->gave_up = true;
      return Wait::kPfs;
    }
    backoff(round);
  }
}

// A read served from `w` (bytes read whole at open, or a finished copy
// mapped); -2 when the kernel refused the copy into the caller's buffer.
ssize_t serve_whole(FdEntry* e, Whole* w, uint64_t pos, const iovec* iov, int cnt) {
  ssize_t r = scatter(w->data, w->size, pos, iov, cnt);
  if (r < 0) return r;
  if (w->tier < 0) {
    count_read(e, Source::kWhole, r);
    return r;
  }
  e->tier = uint8_t(w->tier);
  if (!e->switched) {
    e->switched = true;
    add(e->map, c_switches);
  }
  count_read(e, Source::kLocal, r);
  return r;
}

// The finished copy of e's file on `tier`, mapped once into e's Whole (read
// only, shared): from then on a read of the descriptor is the version check
// and one process_vm_writev, not an open, a read and a close of the copy.
// A mapping, not a held descriptor: a descriptor would change the numbers
// open() returns and count against RLIMIT_NOFILE, which the program can
// see; a mapping changes neither. A copy is published whole and never
// written again (the stager writes a new one elsewhere and renames it), so
// the mapping holds the indexed version's bytes for good, even once the
// stager evicts or deletes the copy: that copy's space is then freed only
// when the last duplicate of this descriptor is closed (and its Whole
// retired). A mapping that would fault (the copy shorter than the index
// says) is never made; a read whose copy into the caller's buffer fails
// falls back to the PFS (scatter). Null when it cannot be mapped (the read
// then opens the copy for the one call, as a partial copy's reads do).
Whole* map_copy(FdEntry* e, uint32_t tier) {
  if (Whole* w = __atomic_load_n(&e->whole, __ATOMIC_ACQUIRE)) return w;
  JobMap* m = e->map;
  uint64_t size = m->entry(e->file).size;
  char path[2 * kPathMax + 64];
  if (size == 0 || !copy_path(m, e->file, tier, path, sizeof path)) return nullptr;
  int fd = real::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st;
  void* p = real::fstat(fd, &st) == 0 && uint64_t(st.st_size) == size
                ? real::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0)
                : MAP_FAILED;
  real::close(fd);
  if (p == MAP_FAILED) return nullptr;
  Whole* w = make_whole(static_cast<char*>(p), size, int(tier));
  if (!w) {
    munmap(p, size);
    return nullptr;
  }
  Whole* none = nullptr;  // another thread of this process may have mapped it meanwhile
  if (__atomic_compare_exchange_n(&e->whole, &none, w, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return w;
  munmap(p, size);
  munmap(w, sizeof(Whole));
  return none;
}

// Serves the read from the copy: complete, or the part already written.
// Returns -2 when it could not (the caller reads the PFS).
ssize_t read_copy(FdEntry* e, Wait how, uint32_t tier, uint32_t slot, uint64_t pos,
                  const iovec* iov, int cnt, uint64_t want) {
  JobMap* m = e->map;
  char path[2 * kPathMax + 64];
  bool named = how == Wait::kCopy ? copy_path(m, e->file, tier, path, sizeof path)
                                  : partial_path(m, e->file, tier, path, sizeof path);
  if (!named) return -2;
  // Opened for this call only: Monarch holds no descriptor between calls.
  int fd = real::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -2;
  if (how == Wait::kPartial) {  // the slot must still be this file's copy, that far
    CopySlot* cs = m->copy_slot(slot);
    if (!cs || cs->file.load(std::memory_order_acquire) != e->file + 1 ||
        cs->progress.load(std::memory_order_acquire) < pos + want) {
      real::close(fd);
      return -2;
    }
  }
  ssize_t r = want ? real::preadv(fd, iov, cnt, off_t(pos)) : 0;
  real::close(fd);
  if (r != ssize_t(want)) return -2;
  e->tier = uint8_t(tier);
  if (how == Wait::kPartial) add(m, c_partial_reads);
  if (how == Wait::kCopy && !e->switched) {
    e->switched = true;
    add(m, c_switches);
  }
  count_read(e, Source::kLocal, r);
  return r;
}

ssize_t read_pfs_kind(int fd, FdEntry* e, const iovec* iov, int cnt, off_t off, bool positional,
                      Pass<ssize_t> pass) {
  if (e->gave_up || kernel_refuses(iov, cnt, off, positional)) return read_pass(e, pass);
  if (!positional && (e->shared || !(real::fcntl(fd, F_GETFD) & FD_CLOEXEC)))
    return read_pass(e, pass);  // the offset may be another process's too: the kernel moves it
  if (!identity(fd, e)) return tracked(fd) ? read_pass(e, pass) : pass();
  JobMap* m = e->map;
  if (m->state(e->file).state == kStale) {
    e->gave_up = true;
    return read_pass(e, pass);
  }
  size_t n = total(iov, cnt);
  if (n == 0) return pass();
  Position p(fd, e, off, positional);
  if (!p.ok()) return read_pass(e, pass);
  uint64_t size = m->entry(e->file).size;
  uint64_t pos = p.at(), end = std::min<uint64_t>(pos + n, size), want = end > pos ? end - pos : 0;
  ssize_t r = -2;
  if (Whole* w = __atomic_load_n(&e->whole, __ATOMIC_ACQUIRE)) {
    r = serve_whole(e, w, pos, iov, cnt);
  } else if (want == 0) {
    r = 0;
  } else {
    // A partial copy published (renamed) or its slot reused between the wait
    // and the read is asked again: it is the finished copy now, not a reason
    // to read the whole range from the PFS too.
    for (int attempt = 0; attempt < 3 && r == -2; ++attempt) {
      uint32_t tier = 0, slot = 0;
      Wait how = wait_copy(e, pos, end, tier, slot);
      if (how == Wait::kPfs) break;
      if (how == Wait::kPeer) {
        r = peer_read(m, e->file, pos, want, iov, cnt);
        if (r >= 0) count_read(e, Source::kPeer, r);
        if (r == -2) e->gave_up = true;  // the stager could not: the PFS, for good
        break;
      }
      if (how == Wait::kCopy) {
        Whole* w = map_copy(e, tier);
        r = w ? serve_whole(e, w, pos, iov, cnt)
              : read_copy(e, how, tier, slot, pos, iov, cnt, want);
        break;
      }
      r = read_copy(e, how, tier, slot, pos, iov, cnt, want);
    }
  }
  if (r == -2) {  // the PFS, at the position this read starts at
    uint64_t t0 = monotonic_ns();
    r = real::preadv(fd, iov, cnt, off_t(pos));
    KeepErrno k;
    count_read(e, Source::kPfs, r, monotonic_ns() - t0);
  }
  KeepErrno k;
  if (!p.advance(r)) return -1;
  return r;
}

// A copy the job has since changed (or one set to O_DIRECT): read on the PFS
// file at this descriptor's offset.
ssize_t read_changed(int fd, FdEntry* e, const iovec* iov, int cnt, off_t off, bool positional,
                     Pass<ssize_t> pass) {
  if (kernel_refuses(iov, cnt, off, positional) || total(iov, cnt) == 0 || !identity(fd, e))
    return pass();
  int pfd = open_pfs(e, e->direct ? O_DIRECT : 0);
  if (pfd < 0) return -1;  // never the copy's old bytes: the error of reaching the PFS file
  Position p(fd, e, off, positional);
  ssize_t r = -1;
  if (p.ok()) {
    uint64_t t0 = monotonic_ns();
    r = real::preadv(pfd, iov, cnt, off_t(p.at()));
    KeepErrno k;
    count_read(e, Source::kPfs, r, monotonic_ns() - t0);
    if (!p.advance(r)) r = -1;
  }
  KeepErrno k;
  real::close(pfd);
  return r;
}

}  // namespace

// The read path asks no system call to know which process it runs in (P.pid
// is renewed after fork; owner() would be a getpid per read). A vfork child
// (posix_spawn, Python's subprocess) runs here in its parent's memory until
// exec, and it is safe: its descriptor table is its own copy of the
// parent's, so an entry names an open file the child holds too, and every
// read that could serve wrong bytes checks the claim against the child's
// own descriptor first (identity(); a native read of a copy is right
// whatever the table says). What it writes to the parent's memory is what
// the parent could have written itself: counters (the child's reads count
// as the thread's that called vfork), hints (gave_up, placed: the PFS for
// that descriptor, a request sent), a copy mapped into the shared address
// space, and an entry forgotten when its number names another file in the
// child (the parent then reads that descriptor from the PFS: right bytes).
// The thread that called vfork is suspended outside Monarch, so it holds no
// entry lock; the parent's other threads and the child take the same locks.
ssize_t on_read(int fd, const struct iovec* iov, int cnt, off_t off, bool positional,
                Pass<ssize_t> pass) {
  FdEntry* e = tracked(fd);
  if (!e) return pass();
  if (e->kind.load() == kLocal) {
    if (native_read(e)) return read_local(e, pass);
    return read_changed(fd, e, iov, cnt, off, positional, pass);
  }
  return read_pfs_kind(fd, e, iov, cnt, off, positional, pass);
}

off_t on_lseek(int fd, off_t off, int whence, Pass<off_t> pass) {
  FdEntry* e = tracked(fd);  // no owner(): as on_read, safe in a vfork child
  if (!e) return pass();
  if (e->kind.load() == kPfs) {  // not while an emulated read() moves the offset
    EntryLock lock(e);
    return pass();
  }
  // Where data and holes are is the PFS file's (a copy is dense), and where
  // the end is, once the job has changed the file.
  bool data = whence == SEEK_DATA || whence == SEEK_HOLE;
  if (!data && (native_read(e) || whence != SEEK_END)) return pass();
  if (!identity(fd, e)) return pass();
  int pfd = open_pfs(e);
  if (pfd < 0) return -1;
  off_t pos = real::lseek(pfd, real::lseek(fd, 0, SEEK_CUR), SEEK_SET);
  pos = pos < 0 ? pos : real::lseek(pfd, off, whence);
  if (pos >= 0) pos = real::lseek(fd, pos, SEEK_SET);
  KeepErrno k;
  real::close(pfd);
  return pos;
}

}  // namespace monarch
