// Mappings of dataset files: served from the copy at the mmap when the copy
// is there, and moved onto it later when it was not (mappings.h).
#include "mappings.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "client.h"
#include "fdtable.h"
#include "process.h"
#include "serve.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

namespace monarch {

std::atomic<const std::atomic<uint64_t>*> g_maps_watch{nullptr};
std::atomic<uint64_t> g_maps_seen{0};
bool g_maps_by_lines = false;

namespace {

// The advice a mapping keeps (the kernel's VMA flags), reapplied to the
// mapping that replaces it. Other advice changes no lasting state of a file
// mapping (MADV_WILLNEED, MADV_DONTNEED...), or is unknown here: a mapping
// given unknown advice is never moved.
struct Lasting {
  int set, undo;  // the advice, and the one that clears it
  uint16_t bit, excludes;
};
constexpr Lasting kLasting[] = {
    {MADV_RANDOM, MADV_NORMAL, 1, 2},          {MADV_SEQUENTIAL, MADV_NORMAL, 2, 1},
    {MADV_DONTFORK, MADV_DOFORK, 4, 0},        {MADV_DONTDUMP, MADV_DODUMP, 8, 0},
    {MADV_HUGEPAGE, MADV_NOHUGEPAGE, 16, 32},  {MADV_NOHUGEPAGE, MADV_HUGEPAGE, 32, 16},
    {MADV_MERGEABLE, MADV_UNMERGEABLE, 64, 0},
};
// Advice with no lasting effect on a file mapping that cannot have been written.
constexpr int kPassing[] = {MADV_WILLNEED,
                            MADV_DONTNEED,
                            MADV_FREE,
                            MADV_REMOVE,
                            20 /*COLD*/,
                            21 /*PAGEOUT*/,
                            22 /*POPULATE_READ*/,
                            23 /*POPULATE_WRITE*/,
                            24 /*DONTNEED_LOCKED*/,
                            25 /*COLLAPSE*/};

struct Record {
  uintptr_t addr;
  size_t len;  // whole pages
  off_t off;   // the file offset at addr
  int prot, flags;
  JobMap* map;
  uint32_t file;
  uint16_t advice;            // Lasting bits
  bool moved;                 // the range maps the copy now
  uint64_t dev, ino;          // the file the range maps now
  uint64_t pfs_dev, pfs_ino;  // the PFS file
};

// Mappings beyond this many stay on the PFS.
constexpr int kRecords = 4096;
struct Table {
  std::atomic_flag lock;
  int count;
  Record r[kRecords];
};
std::atomic<Table*> g_table{nullptr};

// (No function-local static: its guard would need libstdc++'s and glibc's
// newer symbols, CMakeLists.txt.)
size_t page() {
  return size_t(sysconf(_SC_PAGESIZE));
}
uintptr_t page_up(uintptr_t v) {
  return (v + page() - 1) & ~(page() - 1);
}

Table* table() {
  return g_table.load(std::memory_order_acquire);
}

// The table, mapped on first use (never malloc: mmap may be called in a
// signal handler); null when it cannot be.
Table* make_table() {
  if (Table* t = table()) return t;
  void* mem = real::mmap(nullptr, sizeof(Table), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return nullptr;
  Table* t = new (mem) Table{};
  Table* none = nullptr;
  if (!g_table.compare_exchange_strong(none, t)) {
    real::munmap(mem, sizeof(Table));
    return none;
  }
  return t;
}

// Held only inside the reentrancy guard, never across a call that waits on
// another thread: spinning is short.
// No cancellation meanwhile: a cancelled holder would leave it taken for good.
struct Locked {
  Table* t;
  NoCancel no_cancel;
  explicit Locked(Table* table) : t(table) {
    while (t->lock.test_and_set(std::memory_order_acquire)) sched_yield();
  }
  ~Locked() { t->lock.clear(std::memory_order_release); }
};

// No signal handler runs between the kernel's view checked and the mapping
// replaced (one that unmapped the range meanwhile would see it replaced).
struct NoSignals {
  sigset_t saved;
  NoSignals() {
    sigset_t all;
    sigfillset(&all);
    for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP}) sigdelset(&all, s);
    sigprocmask(SIG_BLOCK, &all, &saved);
  }
  ~NoSignals() { sigprocmask(SIG_SETMASK, &saved, nullptr); }
};

bool shared(int flags) {
  return (flags & MAP_TYPE) != MAP_PRIVATE;
}
bool overlaps(const Record& r, uintptr_t a, uintptr_t end) {
  return r.addr < end && a < r.addr + r.len;
}

void drop(Table* t, int i) {
  t->r[i] = t->r[--t->count];
  if (t->count == 0) g_maps_watch.store(nullptr, std::memory_order_relaxed);
}

// Splits the record that contains `at` strictly inside into two, as the
// kernel splits its mapping; false when the table is full.
bool split(Table* t, uintptr_t at) {
  for (int i = 0; i < t->count; ++i) {
    Record& r = t->r[i];
    if (at <= r.addr || at >= r.addr + r.len) continue;
    if (t->count == kRecords) return false;
    Record& n = t->r[t->count++];
    n = r;
    n.addr = at;
    n.off += off_t(at - r.addr);
    n.len = r.addr + r.len - at;
    r.len = at - r.addr;
    return true;
  }
  return true;
}

// [a, end) as records of their own; when it cannot be, the records that
// overlap it are dropped (they stay where they are, never moved again).
void isolate(Table* t, uintptr_t a, uintptr_t end) {
  if (split(t, a) && split(t, end)) return;
  for (int i = t->count - 1; i >= 0; --i)
    if (overlaps(t->r[i], a, end)) drop(t, i);
}

// ---- the kernel's view of a range ----

// struct procmap_query (Linux >= 6.11, linux/fs.h), declared here for older headers.
struct ProcmapQuery {
  uint64_t size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset,
      inode;
  uint32_t dev_major, dev_minor, vma_name_size, build_id_size;
  uint64_t vma_name_addr, build_id_addr;
};
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaRead = 1, kVmaWrite = 2, kVmaExec = 4, kVmaShared = 8;

// One mapping as the kernel shows it.
struct Vma {
  uint64_t start, end, offset, dev, ino;
  bool read, write, exec, shared;
};

// Does the mapping `v`, which contains `pos`, map what `r` says at pos, with
// the file (dev, ino)?
bool shows(const Record& r, const Vma& v, uint64_t pos, uint64_t dev, uint64_t ino) {
  return v.start <= pos && pos < v.end && v.dev == dev && v.ino == ino &&
         v.offset + (pos - v.start) == uint64_t(r.off) + (pos - r.addr) && !v.write &&
         v.read == bool(r.prot & PROT_READ) && v.exec == bool(r.prot & PROT_EXEC) &&
         v.shared == shared(r.flags);
}

const char* hex(const char* s, const char* end, uint64_t& v) {
  v = 0;
  const char* b = s;
  for (; s < end; ++s) {
    int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
    if (d < 0) break;
    v = v * 16 + uint64_t(d);
  }
  return s > b ? s : nullptr;
}

// A line of /proc/self/maps: "start-end perms offset major:minor inode [path]".
bool parse_line(const char* s, const char* end, Vma& v) {
  uint64_t major, minor;
  if (!(s = hex(s, end, v.start)) || *s++ != '-' || !(s = hex(s, end, v.end)) || *s++ != ' ' ||
      end - s < 5)
    return false;
  v.read = s[0] == 'r', v.write = s[1] == 'w', v.exec = s[2] == 'x', v.shared = s[3] == 's';
  s += 5;
  if (!(s = hex(s, end, v.offset)) || *s++ != ' ' || !(s = hex(s, end, major)) || *s++ != ':' ||
      !(s = hex(s, end, minor)) || *s++ != ' ')
    return false;
  v.ino = 0;
  for (; s < end && *s >= '0' && *s <= '9'; ++s) v.ino = v.ino * 10 + uint64_t(*s - '0');
  v.dev = makedev(major, minor);
  return true;
}

// /proc/self/maps read line by line (older kernels): every page of r's range shown as r says.
bool shows_by_lines(int fd, const Record& r, uint64_t dev, uint64_t ino) {
  char buf[8192];
  size_t have = 0;
  uint64_t pos = r.addr, end = r.addr + r.len;
  for (;;) {
    ssize_t n = real::read(fd, buf + have, sizeof buf - have);
    if (n <= 0) return false;
    have += size_t(n);
    char* line = buf;
    for (char* nl; (nl = static_cast<char*>(std::memchr(line, '\n', buf + have - line)));
         line = nl + 1) {
      Vma v;
      if (!parse_line(line, nl, v)) return false;
      if (v.end <= pos) continue;
      if (!shows(r, v, pos, dev, ino)) return false;
      pos = v.end;
      if (pos >= end) return true;
    }
    // A line is at most a path (PATH_MAX) and a few numbers: a full
    // buffer with no line end is not /proc/self/maps as the kernel writes it.
    have = size_t(buf + have - line);
    if (have == sizeof buf) return false;
    std::memmove(buf, line, have);
  }
}

// Does every page of r's range map the file (dev, ino) at r's offsets, with
// r's protection (never writable) and sharing?
bool kernel_shows(const Record& r, uint64_t dev, uint64_t ino) {
  int fd = real::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = true;
  bool queried = false;
  for (uint64_t pos = r.addr, end = r.addr + r.len; pos < end;) {
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_addr = pos;
    if (g_maps_by_lines || ioctl(fd, kProcmapQuery, &q) != 0) {
      ok = !queried && (g_maps_by_lines || errno == ENOTTY || errno == EINVAL) &&
           shows_by_lines(fd, r, dev, ino);
      break;
    }
    queried = true;
    Vma v{q.vma_start,
          q.vma_end,
          q.vma_offset,
          makedev(q.dev_major, q.dev_minor),
          q.inode,
          bool(q.vma_flags & kVmaRead),
          bool(q.vma_flags & kVmaWrite),
          bool(q.vma_flags & kVmaExec),
          bool(q.vma_flags & kVmaShared)};
    if (!shows(r, v, pos, dev, ino)) {
      ok = false;
      break;
    }
    pos = v.end;
  }
  real::close(fd);
  return ok;
}

// ---- replacing a range ----

// Maps `fd` as r says at an address of the kernel's choice, gives it r's
// advice, then moves it over r's range (mremap), which replaces the old
// mapping (r.dev, r.ino) in one step: a mapping that cannot be made leaves
// the old one.
bool replace(const Record& r, int fd) {
  int flags = r.flags & ~(MAP_FIXED | MAP_FIXED_NOREPLACE);
  void* tmp = real::mmap(nullptr, r.len, r.prot, flags, fd, r.off);
  if (tmp == MAP_FAILED) return false;
  for (const Lasting& l : kLasting)
    if ((r.advice & l.bit) && real::madvise(tmp, r.len, l.set) != 0) {
      real::munmap(tmp, r.len);
      return false;
    }
  void* at = reinterpret_cast<void*>(r.addr);
  if (real::mremap(tmp, r.len, r.len, MREMAP_MAYMOVE | MREMAP_FIXED, at) != MAP_FAILED) return true;
  // The kernel may have unmapped the target before failing to move: then the
  // new file's mapping goes there directly (the same bytes), never a hole.
  bool hole = !kernel_shows(r, r.dev, r.ino);
  real::munmap(tmp, r.len);
  if (!hole) return false;
  if (real::mmap(at, r.len, r.prot, flags | MAP_FIXED, fd, r.off) == MAP_FAILED) return false;
  for (const Lasting& l : kLasting)
    if (r.advice & l.bit) real::madvise(at, r.len, l.set);
  return true;
}

// r's range onto the copy on `tier`. False leaves it as it was.
bool move(Record& r, uint32_t tier) {
  JobMap* m = r.map;
  char path[2 * kPathMax + 64];
  if (!copy_path(m, r.file, tier, path, sizeof path)) return false;
  // The PFS file still the indexed version (consistency = open: a file
  // replaced on the PFS since the mmap has other bytes).
  char pfs[2 * kPathMax];
  struct statx sx;
  struct stat st;
  if (!pfs_path(m, r.file, pfs, sizeof pfs) ||
      real::statx(AT_FDCWD, pfs, AT_STATX_DONT_SYNC, STATX_BASIC_STATS, &sx) != 0)
    return false;
  st = version_of(sx);
  if (uint64_t(st.st_dev) != r.pfs_dev || uint64_t(st.st_ino) != r.pfs_ino ||
      !m->same_version(r.file, st))
    return false;
  int fd = real::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = real::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
            uint64_t(st.st_size) == m->entry(r.file).size;
  if (ok) {
    NoSignals quiet;
    ok = kernel_shows(r, r.dev, r.ino) && replace(r, fd);
  }
  real::close(fd);
  if (!ok) return false;
  r.moved = true;
  r.dev = uint64_t(st.st_dev), r.ino = uint64_t(st.st_ino);
  // Its bytes are the copy's from now on (count_mapping counted the mapping
  // itself at the mmap: a piece of a split one moves on its own, so only bytes).
  uint64_t size = m->entry(r.file).size, at = uint64_t(r.off);
  add(m, c_mmap_local_bytes, at < size ? std::min<uint64_t>(r.len, size - at) : 0);
  note("a mapping of %.*s (%zu bytes at offset %lld) moved to its copy",
       int(m->path(r.file).size()), m->path(r.file).data(), r.len, (long long)r.off);
  return true;
}

// r's range back onto the PFS file. False leaves it on the copy.
bool put_back(Record& r) {
  char path[2 * kPathMax];
  if (!pfs_path(r.map, r.file, path, sizeof path)) return false;
  int fd = real::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st;
  bool ok = real::fstat(fd, &st) == 0 && uint64_t(st.st_dev) == r.pfs_dev &&
            uint64_t(st.st_ino) == r.pfs_ino;
  if (ok) {
    NoSignals quiet;
    ok = kernel_shows(r, r.dev, r.ino) && replace(r, fd);
  }
  real::close(fd);
  if (ok) {
    r.moved = false;
    r.dev = r.pfs_dev, r.ino = r.pfs_ino;
  } else {
    note("a mapping of %.*s stays on its copy: the PFS file cannot be mapped back",
         int(r.map->path(r.file).size()), r.map->path(r.file).data());
  }
  return ok;
}

// The moved records that overlap [a, end) back on the PFS, then all of them dropped.
void put_back_and_drop(Table* t, uintptr_t a, uintptr_t end) {
  for (int i = t->count - 1; i >= 0; --i) {
    if (!overlaps(t->r[i], a, end)) continue;
    if (t->r[i].moved) put_back(t->r[i]);
    drop(t, i);
  }
}

// Records a mapping of tracked descriptor `fd`'s file: made on the PFS file,
// or on its copy (`moved`: the copy (dev, ino)), which goes back to the PFS
// file if the job changes the file.
void record(void* p, size_t len, int prot, int flags, off_t off, int fd, FdEntry* e, bool moved,
            uint64_t dev = 0, uint64_t ino = 0) {
  JobMap* m = e->map;
  const Attr* a = m->attr(e->file);
  Table* t = make_table();
  if (!a || !t) return;
  uint64_t pfs_ino = m->entry(e->file).ino;
  Locked lock(t);
  if (t->count == kRecords) return;
  Record& r = t->r[t->count++];
  r = Record{
      uintptr_t(p),         page_up(len),          off,    prot,   flags, m, e->file, 0, moved,
      moved ? dev : a->dev, moved ? ino : pfs_ino, a->dev, pfs_ino};
  // The next call looks, whatever it saw before: the copy may have been
  // published since this mmap found none (or the map be a new stager's).
  std::atomic<uint64_t>& changed = m->header().copies_changed;
  g_maps_seen.store(changed.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  g_maps_watch.store(&changed, std::memory_order_relaxed);
}

// Would a mapping with these arguments be recorded? Never one that can be
// written through, or locked, or of anything but whole pages of a file.
bool recordable(int prot, int flags, off_t off, size_t len) {
  int type = flags & MAP_TYPE;
  return len > 0 && (type == MAP_PRIVATE || type == MAP_SHARED || type == MAP_SHARED_VALIDATE) &&
         !(prot & PROT_WRITE) && !(flags & (MAP_LOCKED | MAP_ANONYMOUS | MAP_GROWSDOWN)) &&
         off >= 0 && uint64_t(off) % page() == 0;
}

}  // namespace

void maps_poll() {
  Table* t = table();
  if (!t || !owner()) return;  // a vfork child: its parent's memory
  if (!enter(reinterpret_cast<uintptr_t>(__builtin_frame_address(0)))) return;
  if (t->lock.test_and_set(std::memory_order_acquire)) {  // another thread looks
    leave();
    return;
  }
  NoCancel no_cancel;
  const std::atomic<uint64_t>* w = g_maps_watch.load(std::memory_order_relaxed);
  if (w) g_maps_seen.store(w->load(std::memory_order_acquire), std::memory_order_relaxed);
  for (int i = t->count - 1; i >= 0; --i) {
    Record& r = t->r[i];
    State s = r.map->state(r.file);
    if (!r.moved && s.state == kCached) {
      if (!move(r, s.tier)) drop(t, i);  // stays on the PFS
    } else if (r.moved && s.state == kStale && !(s.aux & kNamesOnly)) {
      put_back(r);
      drop(t, i);
    } else if (!r.moved && (s.state == kStale || s.state == kFailed)) {
      drop(t, i);  // never copied
    }
  }
  t->lock.clear(std::memory_order_release);
  leave();
}

void maps_stale(JobMap* m, uint32_t file) {
  Table* t = table();
  if (!t || !owner()) return;
  Locked lock(t);
  for (int i = t->count - 1; i >= 0; --i) {
    Record& r = t->r[i];
    if (r.map != m || r.file != file) continue;
    if (r.moved) put_back(r);
    drop(t, i);
  }
}

void maps_after_fork() {
  if (Table* t = table()) t->lock.clear();
}

namespace {

// A mapping made over recorded ones (MAP_FIXED) unmaps them first.
void forget(void* addr, size_t len) {
  Table* t = table();
  if (!t) return;
  Locked lock(t);
  uintptr_t a = uintptr_t(addr), end = page_up(a + len);
  isolate(t, a, end);
  for (int i = t->count - 1; i >= 0; --i)
    if (overlaps(t->r[i], a, end)) drop(t, i);
}

}  // namespace

// A mapping of a descriptor opened for writing is the PFS file's and never
// moves; a shared one is a change of the file (made writable by mprotect, it
// writes with no call Monarch sees). When another process of the job writes
// the file, the change would reach a mapping of the copy only at this
// process's next intercepted call, and a program may act on a mapping with
// none in between (an LMDB write transaction reads its meta page through the
// mapping right after the writer's lock, a futex). Reads through read() and
// pread() of such a descriptor are served: they look at the file's state at
// each call.
void* on_mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off, Pass<void*> pass) {
  if ((flags & (MAP_FIXED | MAP_FIXED_NOREPLACE)) == MAP_FIXED && table() && owner())
    forget(addr, len);
  FdEntry* e = tracked(fd);
  if (!e || !owner()) return pass();
  JobMap* m = e->map;
  void* p = MAP_FAILED;
  bool done = false;
  if (e->kind.load() == kPfs && e->writable && shared(flags))
    changes(e);  // writes through it, or after an mprotect, are never seen
  if (e->kind.load() == kLocal && !native_read(e) && identity(fd, e)) {
    int pfd = open_pfs(e, e->direct ? O_DIRECT : 0);  // a changed copy: map the PFS file
    p = pfd >= 0 ? real::mmap(addr, len, prot, flags, pfd, off) : MAP_FAILED;
    KeepErrno k;
    if (pfd >= 0) real::close(pfd);
    done = true;
  } else if (e->kind.load() == kPfs && !e->gave_up && !e->writable) {
    State s = m->state(e->file);
    if (s.state == kCached && identity(fd, e)) {  // the finished copy, same version
      char path[2 * kPathMax + 64];
      int cfd = copy_path(m, e->file, s.tier, path, sizeof path)
                    ? real::open(path, O_RDONLY | O_CLOEXEC)
                    : -1;
      if (cfd >= 0) {
        p = real::mmap(addr, len, prot, flags, cfd, off);
        KeepErrno k;
        struct stat st;
        done = p != MAP_FAILED;
        if (done && recordable(prot, flags, off, len) && real::fstat(cfd, &st) == 0)
          record(p, len, prot, flags, off, fd, e, true, st.st_dev, st.st_ino);
        real::close(cfd);
        if (done) e->tier = uint8_t(s.tier);
      }
    } else if ((s.state == kNone || s.state == kQueued || s.state == kCopying) && !e->placed) {
      e->placed = true;  // the copy soon: the mapping moves onto it
      send(m, Request::kPlace, e->file);
    }
  }
  if (!done) {
    p = pass();
    KeepErrno k;
    bool kept = p != MAP_FAILED && recordable(prot, flags, off, len) && tracked(fd) == e;
    if (kept && e->kind.load() == kPfs && !e->gave_up && !e->writable && identity(fd, e))
      record(p, len, prot, flags, off, fd, e, false);  // moves to the copy once it is there
    else if (kept && native_read(e))  // the copy itself: back to the PFS if the job changes it
      record(p, len, prot, flags, off, fd, e, true, e->dev, e->ino);
  }
  if (p != MAP_FAILED && tracked(fd)) {
    KeepErrno k;
    bool local = (e->kind.load() == kLocal && native_read(e)) || (e->kind.load() == kPfs && done);
    count_mapping(m, e->file, uint64_t(off), len, local);
  }
  return p;
}

int on_munmap(void* addr, size_t len, Pass<int> pass) {
  Table* t = table();
  if (!t || !owner()) return pass();
  Locked lock(t);
  int r = pass();
  if (r == 0) {
    KeepErrno k;
    uintptr_t a = uintptr_t(addr), end = page_up(a + len);
    isolate(t, a, end);
    for (int i = t->count - 1; i >= 0; --i)
      if (overlaps(t->r[i], a, end)) drop(t, i);
  }
  return r;
}

void* on_mremap(void* addr, size_t len, size_t new_len, int flags, void* to, Pass<void*> pass) {
  Table* t = table();
  if (!t || !owner()) return pass();
  // The kernel moves or grows what is there: the PFS file's mapping, as
  // without Monarch; the result is not recorded (it stays on the PFS). A
  // fixed target unmaps what was there.
  if (flags & MREMAP_FIXED) forget(to, new_len);
  Locked lock(t);
  uintptr_t a = uintptr_t(addr);
  put_back_and_drop(t, a, page_up(a + std::max<size_t>(len, 1)));
  return pass();
}

int on_mprotect(void* addr, size_t len, int prot, Pass<int> pass) {
  Table* t = table();
  if (!t || !owner()) return pass();
  uintptr_t a = uintptr_t(addr), end = page_up(a + len);
  if (prot & PROT_WRITE) {
    // Writable from now on: the mapping goes back to the PFS file first and
    // is never moved again. (Recorded mappings are of descriptors opened for
    // reading only: a shared mapping of one that can write is a change at
    // mmap, on_mmap.)
    Locked lock(t);
    put_back_and_drop(t, a, end);
    return pass();
  }
  Locked lock(t);
  int r = pass();
  if (r == 0) {
    KeepErrno k;
    isolate(t, a, end);
    for (int i = 0; i < t->count; ++i)
      if (overlaps(t->r[i], a, end)) t->r[i].prot = prot;
  }
  return r;
}

int on_madvise(void* addr, size_t len, int advice, Pass<int> pass) {
  Table* t = table();
  if (!t || !owner()) return pass();
  Locked lock(t);
  int r = pass();
  if (r != 0 || std::find(std::begin(kPassing), std::end(kPassing), advice) != std::end(kPassing))
    return r;
  KeepErrno k;
  uintptr_t a = uintptr_t(addr), end = page_up(a + len);
  const Lasting* lasting = nullptr;
  for (const Lasting& l : kLasting)
    if (l.set == advice) lasting = &l;
  if (!lasting && advice != MADV_NORMAL && advice != MADV_DOFORK && advice != MADV_DODUMP &&
      advice != MADV_UNMERGEABLE) {
    for (int i = t->count - 1; i >= 0; --i)  // unknown here: never moved
      if (overlaps(t->r[i], a, end) && !t->r[i].moved) drop(t, i);
    return r;
  }
  isolate(t, a, end);
  for (int i = 0; i < t->count; ++i) {
    Record& rec = t->r[i];
    if (!overlaps(rec, a, end)) continue;
    if (lasting) {
      rec.advice = uint16_t((rec.advice & ~lasting->excludes) | lasting->bit);
    } else {
      for (const Lasting& l : kLasting)
        if (l.undo == advice) rec.advice = uint16_t(rec.advice & ~l.bit);
    }
  }
  return r;
}

int on_mlock(void* addr, size_t len, bool all, Pass<int> pass) {
  Table* t = table();
  if (!t || !owner()) return pass();
  Locked lock(t);
  int r = pass();
  if (r != 0) return r;
  uintptr_t a = all ? 0 : uintptr_t(addr), end = all ? UINTPTR_MAX : page_up(a + len);
  for (int i = t->count - 1; i >= 0; --i)  // locked pages stay the ones they are
    if (overlaps(t->r[i], a, end)) drop(t, i);
  return r;
}

int maps_records(uintptr_t* addr, size_t* len, bool* moved, int cap) {
  Table* t = table();
  if (!t) return 0;
  Locked lock(t);
  for (int i = 0; i < t->count && i < cap; ++i)
    addr[i] = t->r[i].addr, len[i] = t->r[i].len, moved[i] = t->r[i].moved;
  return t->count;
}

}  // namespace monarch
