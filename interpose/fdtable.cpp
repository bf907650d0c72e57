#include "fdtable.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <new>

#include "handlers.h"
#include "process.h"

namespace monarch {

std::atomic<FdEntry*> g_chunks[kChunks];
__thread ThreadSlot t_slot __attribute__((tls_model("initial-exec")));
__thread uintptr_t t_entered __attribute__((tls_model("initial-exec"))) = 0;

FdEntry* slot_for(int fd) {
  if (unsigned(fd) >= unsigned(kTableLimit)) return nullptr;
  auto& chunk = g_chunks[fd >> kChunkBits];
  FdEntry* c = chunk.load(std::memory_order_acquire);
  if (!c) {
    void* p = real::mmap(nullptr, sizeof(FdEntry) << kChunkBits, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    FdEntry* expect = nullptr;
    if (chunk.compare_exchange_strong(expect, static_cast<FdEntry*>(p)))
      c = static_cast<FdEntry*>(p);
    else
      munmap(p, sizeof(FdEntry) << kChunkBits), c = expect;
  }
  return &c[fd & ((1 << kChunkBits) - 1)];
}

Whole* make_whole(char* data, uint64_t size, int tier) {
  void* p = real::mmap(nullptr, sizeof(Whole), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
  return p == MAP_FAILED ? nullptr : new (p) Whole{{1}, data, size, tier};
}

namespace {
// Bytes read whole (or a copy mapped) are given back a second after their last descriptor goes:
// another thread may still be inside a read of them (a close racing a read
// is the program's business; a crash would be ours).
// Signals are blocked while the ring's lock is held: a handler that closes a
// descriptor on this thread would otherwise spin on it for ever.
void retire(Whole* w) {
  static std::atomic_flag lock = ATOMIC_FLAG_INIT;
  static struct {
    Whole* w;
    uint64_t at;
  } ring[64];
  static unsigned next = 0;
  uint64_t now = monotonic_ns();
  sigset_t all, old;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  while (lock.test_and_set(std::memory_order_acquire)) sched_yield();
  for (auto& r : ring)
    if (r.w && (now - r.at > 1'000'000'000 || &r == &ring[next % 64])) {
      munmap(r.w->data, r.w->size ? r.w->size : 1);
      munmap(r.w, sizeof(Whole));
      r.w = nullptr;
    }
  ring[next % 64] = {w, now};
  next++;
  lock.clear(std::memory_order_release);
  sigprocmask(SIG_SETMASK, &old, nullptr);
}

void drop_whole(FdEntry* e) {
  Whole* w = __atomic_exchange_n(&e->whole, nullptr, __ATOMIC_ACQ_REL);
  if (w && w->refs.fetch_sub(1) == 1) retire(w);
}
}  // namespace

FdEntry* track(int fd, JobMap* m, uint32_t file, Kind kind) {
  FdEntry* e = slot_for(fd);
  if (!e) return nullptr;
  if (e->kind.load()) untrack(e);
  e->tier = 0;
  e->view = kNoView;
  e->shared = e->gave_up = e->placed = e->stream = e->switched = e->direct = e->writable = false;
  e->lock.clear();
  e->file = file;
  static std::atomic<uint32_t> next_ofd{1};
  e->ofd = next_ofd.fetch_add(1, std::memory_order_relaxed);
  e->map = m;
  e->dev = e->ino = 0;
  e->whole = nullptr;
  e->stream_from = 0;
  e->kind.store(kind, std::memory_order_release);
  return e;
}

FdEntry* track_copy(int fd, bool shared) {
  JobMap* m;
  uint32_t file, tier;
  struct stat st;
  if (!names_a_copy(fd, m, file, tier) || real::fstat(fd, &st) != 0) return nullptr;
  FdEntry* e = track(fd, m, file, kLocal);
  if (!e) return nullptr;
  e->tier = uint8_t(tier);
  e->dev = st.st_dev;
  e->ino = st.st_ino;
  e->shared = shared;
  e->direct = real::fcntl(fd, F_GETFL) & O_DIRECT;
  return e;
}

void untrack(FdEntry* e) {
  e->kind.store(kUntracked, std::memory_order_release);
  drop_whole(e);
}

void untrack(int fd) {
  if (FdEntry* e = tracked(fd)) untrack(e);
}

void duplicate(FdEntry* from, int to) {
  FdEntry* e = slot_for(to);
  if (!e) return;
  if (e->kind.load()) untrack(e);
  from->shared = true;
  e->tier = from->tier;
  e->view = from->view;
  e->shared = true;
  e->gave_up = from->gave_up;
  e->placed = from->placed;
  e->stream = false;
  e->stream_from = 0;
  e->switched = from->switched;
  e->lock.clear();
  e->file = from->file;
  e->ofd = from->ofd;
  e->map = from->map;
  e->dev = from->dev;
  e->ino = from->ino;
  e->direct = from->direct;
  e->writable = from->writable;
  e->whole = __atomic_load_n(&from->whole, __ATOMIC_ACQUIRE);
  if (e->whole) e->whole->refs.fetch_add(1);
  e->kind.store(from->kind.load(), std::memory_order_release);
}

struct stat version_of(const struct statx& sx) {
  struct stat st {};
  st.st_dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  st.st_ino = sx.stx_ino;
  st.st_size = off_t(sx.stx_size);
  st.st_mtim = {sx.stx_mtime.tv_sec, long(sx.stx_mtime.tv_nsec)};
  st.st_ctim = {sx.stx_ctime.tv_sec, long(sx.stx_ctime.tv_nsec)};
  return st;
}

bool identity(int fd, FdEntry* e) {
  struct stat st;
  if (e->kind.load() == kLocal) {
    if (real::fstat(fd, &st) == 0 && st.st_dev == dev_t(e->dev) && st.st_ino == ino_t(e->ino))
      return true;
    untrack(e);
    return false;
  }
  // kPfs: the kernel's cached attributes (AT_STATX_DONT_SYNC costs the PFS nothing).
  struct statx sx;
  if (real::statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_BASIC_STATS, &sx) != 0 ||
      !S_ISREG(sx.stx_mode)) {
    untrack(e);
    return false;
  }
  st = version_of(sx);
  if (e->map->same_version(e->file, st)) return true;
  const Attr* a = e->map->attr(e->file);
  if (a && uint64_t(st.st_dev) == a->dev && uint64_t(st.st_ino) == e->map->entry(e->file).ino) {
    e->gave_up = true;  // the dataset file, changed since it was indexed: the PFS only
    return false;
  }
  untrack(e);  // another file on this number: closed and reused behind our back
  return false;
}

EntryLock::EntryLock(FdEntry* entry) : e(entry) {
  while (e->lock.test_and_set(std::memory_order_acquire)) sched_yield();
}

ProcSlot& claim_slot(JobMap* m) {
  uint32_t i = m->header().next_slot.fetch_add(1);
  ProcSlot* s = &m->slot(i < kProcSlots ? i : 0);
  s->pid.store(P.pid.load());
  t_slot = {m, s, i >= kProcSlots};
  return *s;
}

void count_read(FdEntry* e, Source source, ssize_t r, uint64_t ns) {
  if (r < 0) return;
  JobMap* m = e->map;
  uint64_t reads = 1;
  if (source == Source::kStream) {
    reads = stream_reads(uint64_t(r), m->entry(e->file).size, m->attr(e->file));
    if (e->kind.load(std::memory_order_relaxed) == kLocal) {
      add(m, c_tier_reads + e->tier, reads);
      add(m, c_tier_bytes + e->tier, r);
      return;
    }
  }
  switch (source) {
    case Source::kLocal:
      add(m, c_tier_reads + e->tier, 1);
      add(m, c_tier_bytes + e->tier, r);
      if (ns) {
        add(m, c_local_sample_reads, 1);
        add(m, c_local_sample_bytes, r);
        add(m, c_local_sample_ns, ns);
      }
      break;
    case Source::kWhole:
      add(m, c_mem_reads, 1);
      add(m, c_mem_bytes, r);
      break;
    case Source::kPeer:
      add(m, c_peer_served_reads, 1);
      add(m, c_peer_served_bytes, r);
      break;
    case Source::kPfs:
      // What the job reads from the PFS lets stage-ahead go as far (the copy
      // of a small file read whole is the reader's own: not counted).
      m->header().ahead_touched.fetch_add(uint64_t(r), std::memory_order_relaxed);
      [[fallthrough]];
    case Source::kStream:
      add(m, c_pfs_served_reads, reads);
      add(m, c_pfs_served_bytes, r);
      add(m, c_pfs_reads, reads);
      add(m, c_pfs_bytes, r);
      add(m, c_pfs_read_ns, ns);
  }
}

void count_mapping(JobMap* m, uint32_t file, uint64_t off, uint64_t len, bool local) {
  uint64_t size = m->entry(file).size;
  uint64_t n = off < size ? std::min(len, size - off) : 0;
  ProcSlot& s = slot(m);
  add(s, c_mmaps);
  add(s, c_mmap_bytes, n);
  if (local) {
    add(s, c_mmap_local);
    add(s, c_mmap_local_bytes, n);
  }
}

}  // namespace monarch
