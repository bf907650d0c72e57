// libmonarch_interpose.so: serves a job's reads of dataset files from the
// fastest node-local tier that holds them, through the job map the stager
// publishes (stager/src/jobmap.h).
//
// Contracts:
// - What the reader sees (bytes, sizes, offsets, errno) is what it would see
//   without Monarch. Anything unexpected falls back to the real call on the PFS.
// - A path outside the dataset costs a prefix comparison; an fd Monarch did
//   not open costs one table load.
// - No thread is created, nothing is allocated per call, and no lock is held
//   across a call to the PFS, so fork (DataLoader workers) is always safe.
// - How a file is served, by the state of its copy at open:
//     cached          the local copy is opened instead (kLocal)
//     small, not yet  read whole from the PFS into a memfd that replaces the
//                     descriptor; the bytes go to the stager (kMem)
//     large, not yet  the PFS file (kPfs); its first read asks the stager for
//                     a copy and later reads use the part already copied,
//                     then the finished copy
//     otherwise       the PFS file (kPfsPlain)
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fdtable.h"
#include "interpose.h"
#include "jobmap.h"
#include "protocol.h"

namespace monarch {
namespace {

// ---------------------------------------------------------------- basics

struct KeepErrno {
  int saved = errno;
  ~KeepErrno() { errno = saved; }
};

// How long a reader waits for a copy that makes no progress before it reads
// the PFS itself, and how far ahead of a copy's progress a read may start and
// still wait for it rather than read the PFS (about 20 ms of a copy at
// 400 MB/s). A reader at the copy's front waits: reading the same bytes from
// the PFS in parallel is what made the original Monarch read 36-48% twice.
constexpr uint64_t kStallNs = 200'000'000;
constexpr uint64_t kWaitWindow = 8 << 20;
// How long an open waits for a small file someone else is reading whole.
constexpr uint64_t kSmallWaitNs = 1'000'000'000;

// ---------------------------------------------------------------- process state

struct Process {
  bool enabled;
  bool log;
  pid_t pid;
  char root[kPathMax];
  size_t root_len;
  char real_root[kPathMax];
  std::atomic<size_t> real_len;
  char job_dir[kPathMax];
  std::atomic<JobMap*> map;
  std::atomic<uint64_t> next_load_ns;
  std::atomic<int> loading;
  ino_t index_ino;
  std::atomic<int> sock;
  sockaddr_un addr;
  socklen_t addr_len;
  std::atomic_flag cwd_lock;
  char cwd[kPathMax];
  bool cwd_related;  // cwd is inside the dataset or an ancestor of it
};
constinit Process P{};

void note(const char* fmt, ...) {
  if (!P.log) return;
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, "monarch[%d]: ", int(P.pid));
  va_list ap;
  va_start(ap, fmt);
  n += std::vsnprintf(buf + n, sizeof buf - n, fmt, ap);
  va_end(ap);
  if (n > int(sizeof buf) - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  KeepErrno k;
  (void)!syscall(SYS_write, 2, buf, n);
}

bool has_prefix(const char* path, const char* root, size_t len) {
  return len && std::strncmp(path, root, len) == 0 && (path[len] == '/' || path[len] == 0);
}

void update_cwd() {
  char buf[kPathMax];
  bool ok = getcwd(buf, sizeof buf) != nullptr;
  while (P.cwd_lock.test_and_set(std::memory_order_acquire)) sched_yield();
  if (ok)
    std::memcpy(P.cwd, buf, sizeof buf);
  else
    P.cwd[0] = 0;
  size_t n = std::strlen(P.cwd);
  P.cwd_related = ok && (has_prefix(P.cwd, P.root, P.root_len) ||
                         (n && has_prefix(P.root, P.cwd, n)) || std::strcmp(P.cwd, "/") == 0);
  P.cwd_lock.clear(std::memory_order_release);
}

// Maps <job dir>/index. Rate-limited: a job whose stager is absent pays one
// failed open of a local file every half second, on dataset paths only.
JobMap* load_map(bool replace) {
  uint64_t now = monotonic_ns();
  if (now < P.next_load_ns.load() || P.loading.exchange(1)) return P.map.load();
  P.next_load_ns = now + 500'000'000;
  JobMap* result = P.map.load();
  char path[kPathMax + 16];
  std::snprintf(path, sizeof path, "%s/%s", P.job_dir, kIndexName);
  int fd = real::open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  if (fd >= 0 && real::fstat(fd, &st) == 0 && (!result || st.st_ino != P.index_ino) &&
      size_t(st.st_size) >= sizeof(Header)) {
    void* base = real::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base != MAP_FAILED) {
      auto* m = new JobMap(base, st.st_size);
      std::string_view why = m->validate();
      if (why.empty() && std::strcmp(m->header().root, P.root) != 0) why = "another dataset";
      if (why.empty()) {
        // Maps are never unmapped: descriptors opened under an older one still use it.
        size_t n = std::strlen(m->header().real_root);
        std::memcpy(P.real_root, m->header().real_root, n + 1);
        P.real_len = n;
        P.index_ino = st.st_ino;
        P.map = m;
        result = m;
        note("using the job map of %s (%llu files)", P.root,
             (unsigned long long)m->header().file_count);
      } else {
        note("ignoring %s: %.*s", path, int(why.size()), why.data());
        munmap(base, st.st_size);
        delete m;
      }
    }
  } else if (!result) {
    note("no job map at %s yet; reading from the PFS", path);
  }
  if (fd >= 0) real::close(fd);
  P.loading = 0;
  (void)replace;
  return result;
}

JobMap* current_map() {
  JobMap* m = P.map.load(std::memory_order_acquire);
  return m ? m : load_map(false);
}

// Sends one request to the stager; never blocks. `pass_fd` rides along.
bool send(JobMap* m, Request type, uint32_t file, int pass_fd = -1) {
  KeepErrno k;
  int s = P.sock.load();
  if (s < 0) {
    s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int expect = -1;
    if (s >= 0 && !P.sock.compare_exchange_strong(expect, s)) real::close(s), s = expect;
    if (s < 0) return false;
  }
  Message msg{.type = type, .generation = m->header().generation, .file = file, .pid = P.pid};
  iovec iov{&msg, sizeof msg};
  msghdr mh{.msg_name = &P.addr, .msg_namelen = P.addr_len, .msg_iov = &iov, .msg_iovlen = 1};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
  if (pass_fd >= 0) {
    mh.msg_control = cbuf;
    mh.msg_controllen = sizeof cbuf;
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
  }
  return sendmsg(s, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == ssize_t(sizeof msg);
}

// ---------------------------------------------------------------- descriptors

FdEntry* slot_for(int fd) {
  if (unsigned(fd) >= unsigned(kChunks << kChunkBits)) return nullptr;
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

void track(int fd, JobMap* m, uint32_t file, Kind kind, uint32_t tier = 0, bool stale = false) {
  FdEntry* e = slot_for(fd);
  if (!e) return;
  e->kind.store(kUntracked);
  e->tier = uint8_t(tier);
  e->placed = false;
  e->stream = false;
  e->stale = stale;
  e->lock.clear();
  e->file = file;
  e->map = m;
  e->aux = -1;
  e->kind.store(kind, std::memory_order_release);
}

void untrack(FdEntry* e) {
  KeepErrno k;
  if (e->aux >= 0) real::close(e->aux), e->aux = -1;
  e->kind.store(kUntracked, std::memory_order_release);
}

void forget_fd(int fd) {
  if (FdEntry* e = tracked(fd)) untrack(e);
  int s = fd;
  if (fd >= 0 && P.sock.load(std::memory_order_relaxed) == fd)
    P.sock.compare_exchange_strong(s, -1);
}

struct EntryLock {
  FdEntry* e;
  explicit EntryLock(FdEntry* entry) : e(entry) {
    while (e->lock.test_and_set(std::memory_order_acquire)) sched_yield();
  }
  ~EntryLock() { e->lock.clear(std::memory_order_release); }
};

}  // namespace

// ---------------------------------------------------------------- paths

bool outside(int dirfd, const char* path) {
  if (!P.enabled || !path || !*path) return true;
  if (path[0] != '/') return dirfd != AT_FDCWD;  // relative to a directory descriptor: not followed
  size_t rl = P.real_len.load(std::memory_order_relaxed);
  return !has_prefix(path, P.root, P.root_len) && !(rl && has_prefix(path, P.real_root, rl));
}

namespace {

// Is `path` (relative to dirfd) an indexed dataset file? Fills `rel` inside `buf`.
bool dataset_path(int dirfd, const char* path, char (&buf)[kPathMax], std::string_view& rel) {
  if (outside(dirfd, path)) return false;
  int n;
  if (path[0] == '/') {
    n = normalize_path("", path, buf, sizeof buf);
  } else {
    char cwd[kPathMax];
    while (P.cwd_lock.test_and_set(std::memory_order_acquire)) sched_yield();
    bool related = P.cwd_related;
    if (related || std::strstr(path, "..")) std::memcpy(cwd, P.cwd, sizeof cwd);
    P.cwd_lock.clear(std::memory_order_release);
    if (!related && !std::strstr(path, "..")) return false;
    if (!cwd[0]) return false;
    n = normalize_path(cwd, path, buf, sizeof buf);
  }
  if (n < 0) return false;
  std::string_view abs(buf, n);
  rel = under_root(abs, std::string_view(P.root, P.root_len));
  if (!rel.data()) {
    size_t rl = P.real_len.load(std::memory_order_relaxed);
    if (rl) rel = under_root(abs, std::string_view(P.real_root, rl));
  }
  return rel.data() != nullptr;
}

// The dataset file `path` names, or -1.
int64_t lookup(int dirfd, const char* path, JobMap*& m) {
  char buf[kPathMax];
  std::string_view rel;
  if (!dataset_path(dirfd, path, buf, rel)) return -1;
  m = current_map();
  return m ? m->find(rel) : -1;
}

int64_t mtime_ns(const struct stat& st) {
  return int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// Opens the copy of `file` on `tier` with the caller's flags.
int open_copy(JobMap* m, uint32_t file, uint32_t tier, int flags, bool complete = true) {
  char path[2 * kPathMax + 64];
  std::string_view rel = m->path(file);
  int n = complete ? std::snprintf(path, sizeof path, "%s/data/%.*s", m->header().tier_dirs[tier],
                                   int(rel.size()), rel.data())
                   : std::snprintf(path, sizeof path, "%s/tmp/%llu-%u", m->header().tier_dirs[tier],
                                   (unsigned long long)m->header().generation, file);
  if (n <= 0 || size_t(n) >= sizeof path) return -1;
  return real::open(path, flags | O_CLOEXEC * !complete);
}

// ---------------------------------------------------------------- waiting

void backoff(int round) {
  timespec ts{0, round < 10 ? 20'000 : round < 40 ? 200'000 : 1'000'000};
  nanosleep(&ts, nullptr);
}

bool release_claim(JobMap* m, uint32_t file) {
  uint32_t claimed = make_state(kClaimed, 0, uint32_t(P.pid));
  bool ok = m->entry(file).state.compare_exchange_strong(claimed, make_state(kNone));
  if (ok) send(m, Request::kRelease, file);
  return ok;
}

// ---------------------------------------------------------------- open

// Small file, claimed by us: read it whole from the PFS into a memfd that
// takes the place of the PFS descriptor, and hand the bytes to the stager.
int open_whole(JobMap* m, uint32_t file, Pass<int> pass) {
  int fd = pass();
  if (fd < 0) {
    KeepErrno k;
    release_claim(m, file);
    return fd;
  }
  KeepErrno k;
  add(m, c_pfs_opens);
  const Entry& e = m->entry(file);
  uint64_t size = e.size;
  int mfd = int(syscall(SYS_memfd_create, "monarch", MFD_CLOEXEC));
  void* p = MAP_FAILED;
  if (mfd >= 0 && ftruncate(mfd, off_t(size + 1)) == 0)
    p = real::mmap(nullptr, size + 1, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  uint64_t got = 0;
  bool error = p == MAP_FAILED;
  uint64_t t0 = monotonic_ns();
  // One byte more than indexed, until the end of the file: a file that grew
  // or shrank is seen, never served cut. Every read is counted, the last
  // (empty) one too: the PFS served it.
  while (!error && got < size + 1) {
    ssize_t r = real::pread(fd, static_cast<char*>(p) + got, size + 1 - got, off_t(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) error = true;
    if (r < 0) break;
    add(m, c_pfs_reads);
    add(m, c_pfs_bytes, r);
    if (r == 0) break;
    got += r;
  }
  add(m, c_pfs_read_ns, monotonic_ns() - t0);
  if (p != MAP_FAILED) munmap(p, size + 1);
  if (error || got != size || ftruncate(mfd, off_t(size)) != 0) {
    if (mfd >= 0) real::close(mfd);
    bool changed = !error && got != size;
    if (changed) {
      add(m, c_fb_stale);
      send(m, Request::kStale, file);
    }
    release_claim(m, file);
    track(fd, m, file, kPfsPlain, 0, changed);
    return fd;
  }
  if (send(m, Request::kData, file, mfd)) {
    add(m, c_handoffs);
    add(m, c_handoff_bytes, size);
  } else {
    release_claim(m, file);
  }
  // A read-only descriptor of the memfd, as the caller asked for O_RDONLY.
  char self[64];
  std::snprintf(self, sizeof self, "/proc/self/fd/%d", mfd);
  int ro = real::open(self, O_RDONLY | O_CLOEXEC);
  int src = ro >= 0 ? ro : mfd;
  int fdflags = fcntl(fd, F_GETFD);
  if (real::dup3(src, fd, (fdflags >= 0 && (fdflags & FD_CLOEXEC)) ? O_CLOEXEC : 0) < 0) {
    if (ro >= 0) real::close(ro);
    real::close(mfd);
    track(fd, m, file, kPfsPlain);
    return fd;
  }
  if (ro >= 0) real::close(ro);
  real::close(mfd);
  track(fd, m, file, kMem);
  return fd;
}

// A small file someone else is copying or reading whole: wait for the copy.
uint32_t wait_small(JobMap* m, uint32_t file) {
  uint64_t start = monotonic_ns();
  for (int round = 0;; ++round) {
    uint32_t s = m->entry(file).state.load(std::memory_order_acquire);
    FileState st = state_of(s);
    if (st != kClaimed && st != kQueued && st != kCopying) return s;
    uint64_t now = monotonic_ns();
    if (!m->stager_alive(now) || now - start > kSmallWaitNs) {
      add(m, c_fb_wait);
      return make_state(kFailed);
    }
    backoff(round);
  }
}

}  // namespace

__thread int t_depth __attribute__((tls_model("initial-exec"))) = 0;
__thread ThreadSlot t_slot __attribute__((tls_model("initial-exec")));
std::atomic<FdEntry*> g_chunks[kChunks];

ProcSlot& claim_slot(JobMap* m) {
  uint32_t i = m->header().next_slot.fetch_add(1);
  ProcSlot* s = &m->slot(i < kProcSlots ? i : 0);
  s->pid.store(P.pid);
  t_slot = {m, s, i >= kProcSlots};
  return *s;
}

int on_open(int dirfd, const char* path, int flags, mode_t mode, Pass<int> pass) {
  JobMap* m = nullptr;
  int64_t id = lookup(dirfd, path, m);
  if (id < 0) return pass();
  uint32_t file = uint32_t(id);
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC)) {
    int fd = pass();
    KeepErrno k;
    if (fd >= 0) send(m, Request::kStale, file);  // it may change: stop serving the copy
    return fd;
  }
  if (flags & (O_CREAT | O_TMPFILE | O_PATH | O_DIRECTORY | O_DIRECT | O_NOATIME)) return pass();
  add(m, c_opens);
  const Entry& e = m->entry(file);
  bool alive = m->stager_alive(monotonic_ns());
  bool stale = false;
  if (m->header().consistency == 1) {  // check the PFS file at every open
    struct stat st;
    KeepErrno k;
    add(m, c_stat_pfs);
    if (real::fstatat(dirfd, path, &st, 0) != 0) return pass();
    stale = uint64_t(st.st_size) != e.size || mtime_ns(st) != e.mtime_ns;
    if (stale) {
      add(m, c_fb_stale);
      send(m, Request::kStale, file);
    }
  }
  uint32_t s = e.state.load(std::memory_order_acquire);
  if (!stale && alive && e.size <= m->header().small_file_max) {
    for (;;) {
      FileState st = state_of(s);
      if (st == kNone) {
        uint32_t expect = s;
        if (m->entry(file).state.compare_exchange_strong(expect,
                                                         make_state(kClaimed, 0, uint32_t(P.pid))))
          return open_whole(m, file, pass);
        s = expect;
        continue;
      }
      if (st == kClaimed || st == kQueued || st == kCopying) s = wait_small(m, file);
      break;
    }
  }
  if (!stale && state_of(s) == kCached) {
    KeepErrno k;
    int fd = open_copy(m, file, tier_of(s), flags);
    if (fd >= 0) {
      add(m, c_tier_opens + tier_of(s));
      track(fd, m, file, kLocal, tier_of(s));
      return fd;
    }
    add(m, c_fb_error);
    note("cannot open the copy of %s: %s; reading from the PFS", path, std::strerror(errno));
  }
  int fd = pass();
  if (fd < 0) return fd;
  KeepErrno k;
  add(m, c_pfs_opens);
  if (!alive) {
    add(m, c_fb_no_stager);
    load_map(true);  // a restarted stager publishes a new map
  }
  FileState st = state_of(s);
  bool may_copy = alive && !stale && (st == kNone || st == kQueued || st == kCopying);
  track(fd, m, file, may_copy ? kPfs : kPfsPlain, 0, stale);
  return fd;
}

FILE* on_fopen(const char* path, const char* mode, Pass<FILE*> pass) {
  JobMap* m = nullptr;
  if (!mode || mode[0] != 'r' || std::strpbrk(mode, "+wa") || lookup(AT_FDCWD, path, m) < 0)
    return pass();
  int flags = O_RDONLY | (std::strchr(mode, 'e') ? O_CLOEXEC : 0);
  auto open_pfs = [&] { return real::open(path, flags); };
  int fd = on_open(AT_FDCWD, path, flags, 0, Pass<int>(open_pfs));
  if (fd < 0) return nullptr;
  FILE* f = fdopen(fd, mode);
  if (!f) {
    KeepErrno k;
    forget_fd(fd);
    real::close(fd);
    return nullptr;
  }
  if (FdEntry* e = tracked(fd)) e->stream = true;
  return f;
}

namespace {

// Counts a read answered by `kind` (the tier is e->tier) with result r. The
// totals (reads, bytes) are sums the stager derives: fewer atomic additions here.
inline void count_read(FdEntry* e, Kind kind, ssize_t r, uint64_t ns = 0) {
  if (r < 0) return;
  JobMap* m = e->map;
  auto inc = [m](int c, uint64_t n) { add(m, c, n); };
  switch (kind) {
    case kLocal:
      inc(c_tier_reads + e->tier, 1);
      inc(c_tier_bytes + e->tier, r);
      if (ns)
        inc(c_local_sample_reads, 1), inc(c_local_sample_bytes, r), inc(c_local_sample_ns, ns);
      break;
    case kMem:
      inc(c_mem_reads, 1), inc(c_mem_bytes, r);
      break;
    default:
      inc(c_pfs_served_reads, 1), inc(c_pfs_served_bytes, r);
      inc(c_pfs_reads, 1), inc(c_pfs_bytes, r), inc(c_pfs_read_ns, ns);
  }
}

// A read from a local copy that is timed, for the local read rate (the
// wrappers serve 63 of 64 local reads inline, untimed).
ssize_t read_local(FdEntry* e, Pass<ssize_t> pass) {
  uint64_t t0 = monotonic_ns();
  ssize_t r = pass();
  count_read(e, kLocal, r, monotonic_ns() - t0 + 1);
  return r;
}

__attribute__((noinline)) ssize_t read_pfs(FdEntry* e, Pass<ssize_t> pass) {
  uint64_t t0 = monotonic_ns();
  ssize_t r = pass();
  KeepErrno k;
  count_read(e, kPfsPlain, r, monotonic_ns() - t0);
  return r;
}

// Moves a kPfs descriptor to the finished copy, keeping number, offset and
// flags. Holds the entry lock.
bool switch_to_copy(FdEntry* e, int fd, uint32_t tier) {
  if (e->kind.load() != kPfs) return true;
  KeepErrno k;
  int cfd = open_copy(e->map, e->file, tier, O_RDONLY);
  if (cfd < 0) return false;
  off_t pos = real::lseek(fd, 0, SEEK_CUR);
  int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
  bool ok = pos >= 0 && real::lseek(cfd, pos, SEEK_SET) == pos &&
            (fl < 0 || fcntl(cfd, F_SETFL, fl) == 0) &&
            real::dup3(cfd, fd, (fdfl >= 0 && (fdfl & FD_CLOEXEC)) ? O_CLOEXEC : 0) == fd;
  real::close(cfd);
  if (!ok) return false;
  if (e->aux >= 0) real::close(e->aux), e->aux = -1;
  e->tier = uint8_t(tier);
  e->kind.store(kLocal, std::memory_order_release);
  add(e->map, c_switches);
  return true;
}

constexpr ssize_t kNotYet = -2;

// Serves [pos, pos+n) from the copy being written if that part is written.
// Otherwise `distance` tells how far ahead of the copy the read starts.
ssize_t read_partial(FdEntry* e, int fd, void* buf, size_t n, off_t off, uint32_t s,
                     uint64_t& distance) {
  JobMap* m = e->map;
  const Entry& fe = m->entry(e->file);
  CopySlot& cs = m->header().copies[aux_of(s)];
  if (cs.file.load(std::memory_order_acquire) != e->file + 1) return kNotYet;
  uint64_t progress = cs.progress.load(std::memory_order_acquire);
  EntryLock lock(e);
  off_t pos = off >= 0 ? off : real::lseek(fd, 0, SEEK_CUR);
  if (pos < 0) return kNotYet;
  uint64_t end = std::min<uint64_t>(pos + n, fe.size);
  if (uint64_t(pos) >= fe.size) end = pos;  // at or past the end: 0 bytes, as the PFS says
  if (end > progress) {
    distance = uint64_t(pos) > progress ? pos - progress : 0;
    return kNotYet;
  }
  if (e->aux < 0) e->aux = open_copy(m, e->file, tier_of(s), O_RDONLY, false);
  // The slot must still be ours after opening: a reused slot means another file.
  if (e->aux < 0 || cs.file.load(std::memory_order_acquire) != e->file + 1) return kNotYet;
  ssize_t r = end > uint64_t(pos) ? real::pread(e->aux, buf, end - pos, pos) : 0;
  if (r != ssize_t(end - pos)) return kNotYet;
  if (off < 0 && real::lseek(fd, pos + r, SEEK_SET) < 0) return kNotYet;
  e->tier = uint8_t(tier_of(s));
  add(m, c_partial_reads);
  count_read(e, kLocal, r);
  return r;
}

// A read on a PFS descriptor whose file may get a copy.
__attribute__((noinline)) ssize_t read_copying(FdEntry* e, int fd, void* buf, size_t n, off_t off,
                                               Pass<ssize_t> pass) {
  JobMap* m = e->map;
  const Entry& fe = m->entry(e->file);
  uint64_t last_progress = ~0ull, last_change = monotonic_ns();
  for (int round = 0;; ++round) {
    uint32_t s = fe.state.load(std::memory_order_acquire);
    FileState st = state_of(s);
    if (st == kCached) {
      bool ok;
      {
        EntryLock lock(e);
        ok = switch_to_copy(e, fd, tier_of(s));
      }
      if (ok) return read_local(e, pass);
      add(m, c_fb_error);
      e->kind.store(kPfsPlain);
      break;
    }
    uint64_t now = monotonic_ns();
    if (!m->stager_alive(now)) {
      add(m, c_fb_no_stager);
      e->kind.store(kPfsPlain);
      break;
    }
    // Ask once per descriptor: for a file nobody copies yet, and for a
    // background copy, which then goes before the backlog (or resumes if paused).
    if (!e->placed && (st == kNone || st == kQueued || st == kCopying)) {
      e->placed = true;
      if (!send(m, Request::kPlace, e->file) && st == kNone) break;
      last_change = now;
    }
    if (st != kNone && st != kQueued && st != kCopying) {
      e->kind.store(kPfsPlain);  // no room, failed, stale, claimed: the PFS it is
      break;
    }
    uint64_t progress = 0;
    if (st == kCopying) {
      uint64_t distance = 0;
      ssize_t r = read_partial(e, fd, buf, n, off, s, distance);
      if (r != kNotYet) return r;
      if (distance > kWaitWindow) break;  // far ahead of the copy: cheaper to read it
      progress = m->header().copies[aux_of(s)].progress.load();
    }
    if (progress != last_progress || round == 0) last_progress = progress, last_change = now;
    if (now - last_change > kStallNs) {
      add(m, c_fb_wait);
      break;
    }
    backoff(round);
  }
  if (off < 0) {  // read() moves the offset: keep it consistent with partial reads
    EntryLock lock(e);
    return read_pfs(e, pass);
  }
  return read_pfs(e, pass);
}

}  // namespace

ssize_t on_read(int fd, void* buf, size_t n, off_t off, Pass<ssize_t> pass) {
  FdEntry* e = tracked(fd);
  if (!e) return pass();
  switch (e->kind.load(std::memory_order_acquire)) {
    case kLocal:
      return read_local(e, pass);
    case kMem: {
      ssize_t r = pass();
      count_read(e, kMem, r);
      return r;
    }
    case kPfs:
      return read_copying(e, fd, buf, n, off, pass);
    default:
      return read_pfs(e, pass);
  }
}

ssize_t on_readv(int fd, const struct iovec* iov, int cnt, off_t off, Pass<ssize_t> pass) {
  FdEntry* e = tracked(fd);
  if (!e) return pass();
  Kind k = Kind(e->kind.load(std::memory_order_acquire));
  if (k == kPfs) {  // rare: no partial reads for vectors; a finished copy is still used
    uint32_t s = e->map->entry(e->file).state.load();
    if (state_of(s) == kCached) {
      EntryLock lock(e);
      if (switch_to_copy(e, fd, tier_of(s))) k = kLocal;
    } else if (!e->placed && state_of(s) == kNone) {
      e->placed = true;
      send(e->map, Request::kPlace, e->file);
    }
  }
  if (k == kLocal) return read_local(e, pass);
  if (k == kMem) {
    ssize_t r = pass();
    count_read(e, kMem, r);
    return r;
  }
  return read_pfs(e, pass);
}

off_t on_lseek(int fd, Pass<off_t> pass) {
  FdEntry* e = tracked(fd);
  if (!e || e->kind.load() != kPfs) return pass();
  EntryLock lock(e);
  return pass();
}

void* on_mmap(int fd, size_t len, Pass<void*> pass) {
  FdEntry* e = tracked(fd);
  if (!e) return pass();
  JobMap* m = e->map;
  if (e->kind.load() == kPfs) {
    KeepErrno k;
    uint32_t s = m->entry(e->file).state.load();
    if (state_of(s) == kCached) {
      EntryLock lock(e);
      switch_to_copy(e, fd, tier_of(s));
    } else if (!e->placed && state_of(s) == kNone) {
      e->placed = true;
      send(m, Request::kPlace, e->file);
    }
  }
  void* p = pass();
  if (p != MAP_FAILED) {
    KeepErrno k;
    add(m, c_mmaps);
    // Pages are read later, unseen: the mapped length stands for the bytes read.
    uint64_t n = std::min<uint64_t>(len, m->entry(e->file).size);
    Kind kind = Kind(e->kind.load());
    add(m,
        kind == kLocal ? c_tier_bytes + e->tier
        : kind == kMem ? c_mem_bytes
                       : c_pfs_served_bytes,
        n);
  }
  return p;
}

int on_stat(int dirfd, const char* path, struct stat* st, Pass<int> pass) {
  JobMap* m = nullptr;
  int64_t id = lookup(dirfd, path, m);
  if (id < 0) return pass();
  if (m->header().consistency == 1 || !m->fill_stat(uint32_t(id), st)) {
    KeepErrno k;
    add(m, c_stat_pfs);
    return pass();
  }
  add(m, c_stat_index);
  return 0;
}

int on_fstat(int fd, struct stat* st, Pass<int> pass) {
  FdEntry* e = tracked(fd);
  if (!e || e->stale || !e->map->fill_stat(e->file, st)) return pass();
  add(e->map, c_stat_index);
  return 0;
}

int on_fstatat(int dirfd, const char* path, struct stat* st, int flags, Pass<int> pass) {
  if ((flags & AT_EMPTY_PATH) && path && !*path) return on_fstat(dirfd, st, pass);
  if (flags & ~(AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_EMPTY_PATH)) return pass();
  return on_stat(dirfd, path, st, pass);
}

int on_statx(int dirfd, const char* path, int flags, unsigned mask, struct statx* stx,
             Pass<int> pass) {
  if (mask & ~unsigned(STATX_BASIC_STATS)) return pass();  // fields the index does not hold
  struct stat st;
  JobMap* m = nullptr;
  bool ok = false;
  if ((flags & AT_EMPTY_PATH) && path && !*path) {
    FdEntry* e = tracked(dirfd);
    m = e ? e->map : nullptr;
    ok = e && !e->stale && m->fill_stat(e->file, &st);
  } else if (!(flags & ~(AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | AT_STATX_DONT_SYNC))) {
    int64_t id = lookup(dirfd, path, m);
    ok = id >= 0 && m->header().consistency == 0 && m->fill_stat(uint32_t(id), &st);
  }
  if (!ok) return pass();
  std::memset(stx, 0, sizeof *stx);
  stx->stx_mask = STATX_BASIC_STATS;
  stx->stx_blksize = uint32_t(st.st_blksize);
  stx->stx_nlink = uint32_t(st.st_nlink);
  stx->stx_uid = st.st_uid;
  stx->stx_gid = st.st_gid;
  stx->stx_mode = uint16_t(st.st_mode);
  stx->stx_ino = st.st_ino;
  stx->stx_size = uint64_t(st.st_size);
  stx->stx_blocks = uint64_t(st.st_blocks);
  auto ts = [](const timespec& t) { return statx_timestamp{t.tv_sec, uint32_t(t.tv_nsec), 0}; };
  stx->stx_atime = ts(st.st_atim);
  stx->stx_mtime = ts(st.st_mtim);
  stx->stx_ctime = ts(st.st_ctim);
  stx->stx_dev_major = major(st.st_dev);
  stx->stx_dev_minor = minor(st.st_dev);
  add(m, c_stat_index);
  return 0;
}

int on_close(int fd, Pass<int> pass) {
  forget_fd(fd);
  return pass();
}

int on_fclose(FILE* f, Pass<int> pass) {
  int fd = f ? fileno(f) : -1;
  if (FdEntry* e = tracked(fd)) {
    KeepErrno k;
    if (e->stream) {  // stdio reads are not seen: count what the stream consumed
      off_t pos = real::lseek(fd, 0, SEEK_CUR);
      if (pos > 0) count_read(e, Kind(e->kind.load()), pos);
    }
    untrack(e);
  }
  return pass();
}

int on_replace_fd(int newfd, Pass<int> pass) {
  forget_fd(newfd);
  return pass();
}

int on_close_range(unsigned first, unsigned last, int flags, Pass<int> pass) {
  if (!(flags & CLOSE_RANGE_CLOEXEC)) {
    for (int c = 0; c < kChunks; ++c) {
      FdEntry* chunk = g_chunks[c].load();
      if (!chunk) continue;
      for (int i = 0; i < (1 << kChunkBits); ++i) {
        unsigned fd = (unsigned(c) << kChunkBits) + i;
        if (fd >= first && fd <= last && chunk[i].kind.load()) untrack(&chunk[i]);
      }
    }
    int s = P.sock.load();
    if (s >= 0 && unsigned(s) >= first && unsigned(s) <= last) P.sock = -1;
  }
  return pass();
}

int on_chdir(Pass<int> pass) {
  int r = pass();
  if (r == 0 && P.enabled) {
    KeepErrno k;
    update_cwd();
  }
  return r;
}

namespace {

void after_fork_child() {
  P.pid = pid_t(syscall(SYS_getpid));
  t_slot = {};  // the forking thread's slot stays the parent's
  for (auto& chunk : g_chunks)
    if (FdEntry* c = chunk.load())
      for (int i = 0; i < (1 << kChunkBits); ++i) c[i].lock.clear();
}

__attribute__((constructor)) void init() {
  real::resolve();
  P.pid = pid_t(syscall(SYS_getpid));
  P.sock = -1;
  const char* log = getenv(kEnvLog);
  P.log = log && *log && std::strcmp(log, "0") != 0;
  const char* dataset = getenv(kEnvDataset);
  const char* job = getenv(kEnvJobDir);
  if (!dataset || !*dataset || !job || !*job) return;
  char cwd[kPathMax] = "";
  if (dataset[0] != '/' && !getcwd(cwd, sizeof cwd)) return;
  int n = normalize_path(cwd, dataset, P.root, sizeof P.root);
  if (n <= 1 || std::strlen(job) >= sizeof P.job_dir) return;
  while (n > 1 && P.root[n - 1] == '/') P.root[--n] = 0;
  P.root_len = n;
  std::strcpy(P.job_dir, job);
  char sock[kPathMax + 16];
  std::snprintf(sock, sizeof sock, "%s/%s", job, kSocketName);
  if (std::strlen(sock) >= sizeof P.addr.sun_path) {
    note("job directory path too long for a socket; copies are made ahead only");
    return;
  }
  P.addr.sun_family = AF_UNIX;
  std::strcpy(P.addr.sun_path, sock);
  P.addr_len = socklen_t(offsetof(sockaddr_un, sun_path) + std::strlen(sock) + 1);
  pthread_atfork(nullptr, nullptr, after_fork_child);
  update_cwd();
  P.enabled = true;
}

}  // namespace
}  // namespace monarch
