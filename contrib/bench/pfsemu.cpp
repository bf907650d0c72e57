// monarch-pfsemu: read-only FUSE passthrough that emulates a busy parallel file system (PFS)
// and counts exactly the requests it serves. Command line: see Usage().
//  * Mirrors --source read-only (mount option ro: writes fail with EROFS). default_permissions
//    (plus allow_other when root, or with --allow-other, which a user may give only where
//    /etc/fuse.conf says user_allow_other: then root's lookups reach the daemon too) makes the
//    kernel check the source's modes and owners like a real file system.
//    st_ino/st_size/st_mtime are the source's; attributes and entries are cached by the kernel
//    for at most 1 s.
//  * Cost: each READ takes latency-us, then n/bandwidth on one shared link (a timeline reserved
//    atomically: concurrent requests overlap their latency but share the bandwidth); each open
//    of a regular file takes open-latency-us. Each LOOKUP and GETATTR takes stat-latency-us
//    (default 0: free; concurrent ones overlap, as round trips to a metadata server do; the
//    kernel sends the LOOKUPs of one directory one at a time). READDIR is free.
//  * --direct-io (default): FOPEN_DIRECT_IO, so no page cache and no readahead: each read()
//    becomes READs of at most max_pages pages of the caller's buffer (256 unless the sysctl
//    fs.fuse.max_pages_limit is raised, see IoRead: 1 MiB only if the buffer is page-aligned).
//    A read() at EOF is one READ returning 0 bytes (`cat` of 1 MiB: 8 x 128 KiB + 1 empty).
//    mmap works: MAP_PRIVATE always, MAP_SHARED because IoWritev grants the kernel's
//    FUSE_DIRECT_IO_ALLOW_MMAP (Linux >= 6.6; older kernels fail it with ENODEV). Mapped pages
//    are read through the page cache in readahead units.
//  * --cached: page-cache mode without keep_cache (the kernel drops a file's cached pages when
//    it is opened again); read_ahead_kb of the mount is raised to 1024 once it is up.
//  * Counters: opens (OPEN of regular files), reads (READ requests, EOF ones included), bytes
//    (bytes returned), getattrs, lookups (failed ones included), readdirs (READDIR requests; a
//    small directory listing takes 2), link_ns (the time the shared link carried bytes: its
//    busy time). Any path walk, including one to read the counts, may add
//    a GETATTR of a directory whose attributes are older than 1 s. The one-line JSON
//      {"opens":N,"reads":N,"bytes":N,"getattrs":N,"lookups":N,"readdirs":N,"link_ns":N}
//    is (1) written to --counts FILE (tmp + rename) at start, on SIGUSR1 and after unmount, and
//    (2) the content of MOUNT/.pfsemu-counts, a virtual file that is not listed, not counted
//    and recomputed by every read at offset 0.
//  * --stall-comm PREFIX: a fault, for tests: READ requests of a thread whose
//    name (/proc/TID/comm) starts with PREFIX never complete, as if the PFS hung
//    on them (until the session ends). "monarch-" stalls every read of a stager.
//  * --inode-paths: an inode the kernel remembers is held as its path instead of an O_PATH
//    descriptor, and each request opens it by path: for datasets of more files than the
//    open-files limit (1.28 million). A file renamed in the source is then not followed.
//  * SIGTERM/SIGINT/SIGHUP unmount, then write the final counts. Without --foreground the
//    process daemonizes once mounted; the kernel holds requests until the FUSE handshake is
//    done, so the mount point is usable as soon as the command returns.
#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr char kCountsName[] = ".pfsemu-counts";
// How long the kernel caches names and attributes (--attr-timeout-ms): 0 makes
// every open look its name up again, as a client sees another client's rename.
double AttrTimeout();
constexpr unsigned kReadaheadKb = 1024;

struct Options {
  std::string source, mount, counts, stall_comm;
  uint64_t latency_us = 1000, open_latency_us = 1000, bandwidth_mbs = 500, threads = 64;
  uint64_t stat_latency_us = 0;     // per LOOKUP and GETATTR
  uint64_t attr_timeout_ms = 1000;  // how long the kernel may trust names and attributes
  bool direct_io = true, foreground = false, inode_paths = false, allow_other = false;
};

struct Counters {
  std::atomic<uint64_t> opens{0}, reads{0}, bytes{0}, getattrs{0}, lookups{0}, readdirs{0};
  std::atomic<uint64_t> link_ns{0};  // time the shared link was reserved: busy with bytes
};

// A source object the kernel holds a reference to; fuse_ino_t is its address (root: 1).
struct Inode {
  int fd = -1;       // O_PATH descriptor of the source object (-1 with --inode-paths)
  std::string path;  // with --inode-paths: relative to the source
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t nlookup = 0;
};

struct DirHandle {
  DIR* dir = nullptr;
  off_t pos = 0;
  ~DirHandle() {
    if (dir) closedir(dir);
  }
};

// The open directories, owned here: the kernel sends no releasedir for a
// directory still open when the file system goes away, and its handle is
// freed at exit all the same.
class DirHandles {
 public:
  DirHandle* add(std::unique_ptr<DirHandle> h) {
    std::lock_guard lock(mu_);
    DirHandle* raw = h.get();
    open_[raw] = std::move(h);
    return raw;
  }
  void remove(DirHandle* h) {
    std::lock_guard lock(mu_);
    open_.erase(h);
  }

 private:
  std::mutex mu_;
  std::map<DirHandle*, std::unique_ptr<DirHandle>> open_;
};
DirHandles g_dirs;

struct CountsHandle {
  std::mutex mu;
  std::string snapshot;
};

Options g_opt;
Counters g_counts;
Inode g_root;
Inode g_counts_node;  // identity of the virtual counts file; never in g_inodes
std::mutex g_inodes_mu;
std::map<std::pair<dev_t, ino_t>, std::unique_ptr<Inode>> g_inodes;
std::atomic<int64_t> g_link_free_ns{0};  // end of the last reserved slot on the shared link
std::mutex g_counts_file_mu;
std::atomic<bool> g_stop{false};
fuse_session* g_session = nullptr;

double AttrTimeout() {
  return double(g_opt.attr_timeout_ms) / 1000;
}

// The name of the thread that made the request (FUSE gives its thread id).
std::string CommOf(pid_t tid) {
  char path[64], name[32] = "";
  snprintf(path, sizeof path, "/proc/%d/comm", int(tid));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  ssize_t n = read(fd, name, sizeof name - 1);
  close(fd);
  if (n > 0 && name[n - 1] == '\n') --n;
  return std::string(name, n > 0 ? size_t(n) : 0);
}
std::atomic<bool> g_init_seen{false}, g_init_patched{false};
std::atomic<uint64_t> g_init_unique{0};  // unique id of the kernel's INIT request
std::atomic<uint32_t> g_init_flags2{0};  // extended capabilities the kernel offered

constexpr uint32_t kOpInit = 26;                  // FUSE_INIT
constexpr uint32_t kMaxPagesFlag = 1u << 22;      // FUSE_MAX_PAGES (flags)
constexpr uint32_t kInitExt = 1u << 30;           // FUSE_INIT_EXT (flags)
constexpr uint32_t kDirectIoAllowMmap = 1u << 4;  // FUSE_DIRECT_IO_ALLOW_MMAP >> 32 (flags2)
constexpr uint16_t kMaxPages = 512;

fuse_ino_t CountsIno() {
  return reinterpret_cast<fuse_ino_t>(&g_counts_node);
}

Inode& Node(fuse_ino_t ino) {
  return ino == FUSE_ROOT_ID ? g_root : *reinterpret_cast<Inode*>(ino);
}

// A descriptor of an inode's source object for one request: the inode's own,
// or with --inode-paths one opened by its path for the request.
class NodeFd {
 public:
  explicit NodeFd(const Inode& n) : fd_(n.fd), owned_(n.fd < 0) {
    if (owned_) fd_ = openat(g_root.fd, n.path.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  }
  ~NodeFd() {
    if (owned_ && fd_ >= 0) close(fd_);
  }
  NodeFd(const NodeFd&) = delete;
  NodeFd& operator=(const NodeFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
  bool owned_;
};

std::string CountsJson() {
  const Counters& c = g_counts;
  char buf[320];
  snprintf(buf, sizeof buf,
           "{\"opens\":%" PRIu64 ",\"reads\":%" PRIu64 ",\"bytes\":%" PRIu64
           ",\"getattrs\":%" PRIu64 ",\"lookups\":%" PRIu64 ",\"readdirs\":%" PRIu64
           ",\"link_ns\":%" PRIu64 "}\n",
           c.opens.load(), c.reads.load(), c.bytes.load(), c.getattrs.load(), c.lookups.load(),
           c.readdirs.load(), c.link_ns.load());
  return buf;
}

// Replaces --counts FILE atomically; returns false (errno set) on failure.
bool WriteCountsFile() {
  if (g_opt.counts.empty()) return true;
  std::lock_guard<std::mutex> lock(g_counts_file_mu);
  const std::string json = CountsJson(), tmp = g_opt.counts + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  bool ok = write(fd, json.data(), json.size()) == static_cast<ssize_t>(json.size());
  ok = (close(fd) == 0) && ok;
  return ok && rename(tmp.c_str(), g_opt.counts.c_str()) == 0;
}

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void SleepUntilNs(int64_t t) {
  timespec ts{static_cast<time_t>(t / 1000000000), static_cast<long>(t % 1000000000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

// Delays a metadata request (LOOKUP, GETATTR) that arrived at start_ns.
void ChargeStat(int64_t start_ns) {
  if (g_opt.stat_latency_us > 0)
    SleepUntilNs(start_ns + static_cast<int64_t>(g_opt.stat_latency_us) * 1000);
}

// Delays a READ that arrived at start_ns and returns n bytes: first the latency, then an
// exclusive n/bandwidth slot on the shared link.
void ChargeRead(int64_t start_ns, uint64_t n) {
  int64_t done = start_ns + static_cast<int64_t>(g_opt.latency_us) * 1000;
  if (g_opt.bandwidth_mbs > 0 && n > 0) {
    const int64_t cost = static_cast<int64_t>(n * 1000 / g_opt.bandwidth_mbs);
    int64_t prev = g_link_free_ns.load();
    do {
      done = std::max(prev, start_ns + static_cast<int64_t>(g_opt.latency_us) * 1000) + cost;
    } while (!g_link_free_ns.compare_exchange_weak(prev, done));
    g_counts.link_ns += static_cast<uint64_t>(cost);
  }
  if (done > start_ns) SleepUntilNs(done);
}

// Runs a request handler so that no exception reaches libfuse; the handler must reply last.
template <class F>
void Guarded(fuse_req_t req, F&& f) noexcept {
  try {
    f();
  } catch (const std::bad_alloc&) {
    fuse_reply_err(req, ENOMEM);
  } catch (...) {
    fuse_reply_err(req, EIO);
  }
}

void FillCountsAttr(struct stat* st) {
  *st = {};
  st->st_ino = 0x7fffffffffff0001ULL;
  st->st_mode = S_IFREG | 0444;
  st->st_nlink = 1;
  st->st_size = static_cast<off_t>(CountsJson().size());
  st->st_blksize = 4096;
  clock_gettime(CLOCK_REALTIME, &st->st_mtim);
}

void OnInit(void*, fuse_conn_info* conn) {
  // The kernel default of 12 background requests serialises concurrent buffered reads.
  conn->max_background = 256;
  conn->congestion_threshold = 192;
  conn->want &= ~FUSE_CAP_READDIRPLUS;  // keep lookups visible as LOOKUP requests
}

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Guarded(req, [&] {
    fuse_entry_param e{};
    if (parent == FUSE_ROOT_ID && strcmp(name, kCountsName) == 0) {
      e.ino = CountsIno();
      FillCountsAttr(&e.attr);
      return (void)fuse_reply_entry(req, &e);
    }
    const int64_t start = NowNs();
    g_counts.lookups++;
    const Inode& dir = Node(parent);
    int fd = openat(NodeFd(dir).get(), name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return (void)fuse_reply_err(req, errno);
    if (fstatat(fd, "", &e.attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
      int err = errno;
      close(fd);
      return (void)fuse_reply_err(req, err);
    }
    auto fresh = std::make_unique<Inode>();
    Inode* node;
    {
      std::lock_guard<std::mutex> lock(g_inodes_mu);
      auto& slot = g_inodes[{e.attr.st_dev, e.attr.st_ino}];
      if (!slot) {
        *fresh = Inode{fd, {}, e.attr.st_dev, e.attr.st_ino, 0};
        fd = -1;
        if (g_opt.inode_paths) {
          fresh->path = dir.path.empty() ? name : dir.path + "/" + name;
          std::swap(fd, fresh->fd);  // closed below
        }
        slot = std::move(fresh);
      }
      node = slot.get();
      node->nlookup++;
    }
    if (fd >= 0) close(fd);
    e.ino = reinterpret_cast<fuse_ino_t>(node);
    e.attr_timeout = e.entry_timeout = AttrTimeout();
    ChargeStat(start);
    fuse_reply_entry(req, &e);
  });
}

void Forget(fuse_ino_t ino, uint64_t nlookup) {
  if (ino == FUSE_ROOT_ID || ino == CountsIno()) return;
  Inode& node = Node(ino);
  std::lock_guard<std::mutex> lock(g_inodes_mu);
  node.nlookup -= std::min(node.nlookup, nlookup);
  if (node.nlookup == 0) {
    if (node.fd >= 0) close(node.fd);
    g_inodes.erase({node.dev, node.ino});
  }
}

void OnForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  Forget(ino, nlookup);
  fuse_reply_none(req);
}

void OnForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; i++) Forget(forgets[i].ino, forgets[i].nlookup);
  fuse_reply_none(req);
}

void OnGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st;
  if (ino == CountsIno()) {
    FillCountsAttr(&st);
    fuse_reply_attr(req, &st, 0);
    return;
  }
  const int64_t start = NowNs();
  g_counts.getattrs++;
  if (fstatat(NodeFd(Node(ino)).get(), "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) {
    fuse_reply_err(req, errno);
    return;
  }
  ChargeStat(start);
  fuse_reply_attr(req, &st, AttrTimeout());
}

void OnReadlink(fuse_req_t req, fuse_ino_t ino) {
  char buf[PATH_MAX + 1];
  ssize_t n = readlinkat(NodeFd(Node(ino)).get(), "", buf, PATH_MAX);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  buf[n] = '\0';
  fuse_reply_readlink(req, buf);
}

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guarded(req, [&] {
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC))
      return (void)fuse_reply_err(req, EROFS);
    fi->direct_io = g_opt.direct_io || ino == CountsIno();
    fi->keep_cache = 0;
    if (ino == CountsIno()) {
      fi->fh = reinterpret_cast<uint64_t>(new CountsHandle);
      if (fuse_reply_open(req, fi) != 0) delete reinterpret_cast<CountsHandle*>(fi->fh);
      return;
    }
    const int64_t start = NowNs();
    g_counts.opens++;
    // Reopen the O_PATH descriptor for reading; the kernel already checked permissions.
    NodeFd node(Node(ino));
    const std::string path = "/proc/self/fd/" + std::to_string(node.get());
    int fd = node.get() < 0 ? -1 : open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return (void)fuse_reply_err(req, errno);
    if (g_opt.open_latency_us > 0)
      SleepUntilNs(start + static_cast<int64_t>(g_opt.open_latency_us) * 1000);
    fi->fh = static_cast<uint64_t>(fd);
    if (fuse_reply_open(req, fi) != 0) close(fd);
  });
}

void OnRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  Guarded(req, [&] {
    if (ino == CountsIno()) {
      // Unlock before replying: the reply lets the client close, and RELEASE deletes h.
      auto* h = reinterpret_cast<CountsHandle*>(fi->fh);
      std::string part;
      {
        std::lock_guard<std::mutex> lock(h->mu);
        if (off == 0 || h->snapshot.empty()) h->snapshot = CountsJson();
        part = h->snapshot.substr(std::min(static_cast<size_t>(off), h->snapshot.size()), size);
      }
      return (void)fuse_reply_buf(req, part.data(), part.size());
    }
    if (!g_opt.stall_comm.empty() && CommOf(fuse_req_ctx(req)->pid).starts_with(g_opt.stall_comm)) {
      while (!g_stop && !(g_session && fuse_session_exited(g_session))) usleep(50000);
      return (void)fuse_reply_err(req, EIO);
    }
    const int64_t start = NowNs();
    g_counts.reads++;
    thread_local std::vector<char> buf;
    if (buf.size() < size) buf.resize(size);
    size_t got = 0;
    while (got < size) {
      ssize_t n = pread(static_cast<int>(fi->fh), buf.data() + got, size - got, off + got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return (void)fuse_reply_err(req, errno);
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    g_counts.bytes += got;
    ChargeRead(start, got);
    fuse_reply_buf(req, buf.data(), got);
  });
}

void OnRelease(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ino == CountsIno())
    delete reinterpret_cast<CountsHandle*>(fi->fh);
  else
    close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

void OnOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Guarded(req, [&] {
    int fd = openat(NodeFd(Node(ino)).get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return (void)fuse_reply_err(req, errno);
    auto h = std::make_unique<DirHandle>();
    h->dir = fdopendir(fd);
    if (h->dir == nullptr) {
      int err = errno;
      close(fd);
      return (void)fuse_reply_err(req, err);
    }
    DirHandle* held = g_dirs.add(std::move(h));
    fi->fh = reinterpret_cast<uint64_t>(held);
    if (fuse_reply_open(req, fi) != 0) g_dirs.remove(held);
  });
}

void OnReaddir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  Guarded(req, [&] {
    g_counts.readdirs++;
    auto* h = reinterpret_cast<DirHandle*>(fi->fh);
    if (off != h->pos) {
      seekdir(h->dir, off);
      h->pos = off;
    }
    std::vector<char> buf(size);
    size_t used = 0;
    for (;;) {
      errno = 0;
      dirent* d = readdir(h->dir);
      if (d == nullptr) {
        if (errno != 0 && used == 0) return (void)fuse_reply_err(req, errno);
        break;
      }
      struct stat st {};
      st.st_ino = d->d_ino;
      st.st_mode = static_cast<mode_t>(DTTOIF(d->d_type));
      const off_t next = telldir(h->dir);
      size_t len = fuse_add_direntry(req, buf.data() + used, size - used, d->d_name, &st, next);
      if (len > size - used) {  // no room: re-read this entry next time
        seekdir(h->dir, h->pos);
        break;
      }
      used += len;
      h->pos = next;
    }
    fuse_reply_buf(req, buf.data(), used);
  });
}

void OnReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  g_dirs.remove(reinterpret_cast<DirHandle*>(fi->fh));
  fuse_reply_err(req, 0);
}

void OnStatfs(fuse_req_t req, fuse_ino_t) {
  struct statvfs sv;
  if (fstatvfs(g_root.fd, &sv) != 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_statfs(req, &sv);
}

// Custom I/O on /dev/fuse, to set in the INIT reply what libfuse 3.14 cannot:
//  * FUSE_DIRECT_IO_ALLOW_MMAP when the kernel offers it (MAP_SHARED of direct_io files);
//  * max_pages = kMaxPages instead of 256, so that a 1 MiB read into an unaligned buffer
//    (257 pages) can be one READ. The kernel caps it at sysctl fs.fuse.max_pages_limit (256 by
//    default; root may raise it before mounting). libfuse's 1 MiB buffer only limits requests
//    it receives (WRITE, never sent to this read-only mount), not READ replies.
template <class T>
T Load(const void* base, size_t offset) {
  T v;
  memcpy(&v, static_cast<const char*>(base) + offset, sizeof v);
  return v;
}

template <class T>
void Store(void* base, size_t offset, T v) {
  memcpy(static_cast<char*>(base) + offset, &v, sizeof v);
}

// Offsets below are those of struct fuse_in_header (40 bytes) + fuse_init_in, and of
// struct fuse_out_header (16 bytes) and fuse_init_out, in <linux/fuse.h>.
ssize_t IoRead(int fd, void* buf, size_t len, void*) {
  const ssize_t n = read(fd, buf, len);
  if (n >= 40 + 20 && !g_init_seen.load() && Load<uint32_t>(buf, 4) == kOpInit) {
    g_init_flags2 = (Load<uint32_t>(buf, 40 + 12) & kInitExt) ? Load<uint32_t>(buf, 40 + 16) : 0;
    g_init_unique = Load<uint64_t>(buf, 8);
    g_init_seen = true;
  }
  return n;
}

ssize_t IoWritev(int fd, struct iovec* iov, int count, void*) {
  if (g_init_seen.load() && !g_init_patched.load() && count >= 2 && iov[0].iov_len == 16 &&
      iov[1].iov_len >= 36 && Load<uint64_t>(iov[0].iov_base, 8) == g_init_unique.load()) {
    g_init_patched = true;
    void* out = iov[1].iov_base;
    uint32_t flags = Load<uint32_t>(out, 12), flags2 = Load<uint32_t>(out, 32);
    if (g_init_flags2.load() & kDirectIoAllowMmap) {
      flags |= kInitExt;
      flags2 |= kDirectIoAllowMmap;
    }
    if (flags & kMaxPagesFlag) Store(out, 28, std::max(Load<uint16_t>(out, 28), kMaxPages));
    Store(out, 12, flags);
    Store(out, 32, flags2);
  }
  return writev(fd, iov, count);
}

// In --cached mode the kernel caps readahead at 128 KiB during the handshake; raise it after.
void RaiseReadahead() {
  struct statvfs sv;
  if (statvfs(g_opt.mount.c_str(), &sv) != 0) return;  // returns once the handshake is done
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line, devno;
  while (std::getline(mountinfo, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    if (fields >> id >> parent >> dev >> root >> point && point == g_opt.mount) devno = dev;
  }
  std::ofstream ra("/sys/class/bdi/" + devno + "/read_ahead_kb");
  ra << kReadaheadKb << std::endl;
  if (devno.empty() || !ra)
    fprintf(stderr, "monarch-pfsemu: warning: could not raise read_ahead_kb of %s\n",
            g_opt.mount.c_str());
}

// Serves SIGUSR1 (blocked in every thread) by rewriting the counts file.
void SignalThread() {
  if (!g_opt.direct_io) RaiseReadahead();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR1);
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (g_stop) return;
    if (!WriteCountsFile()) perror("monarch-pfsemu: writing counts file");
  }
}

[[noreturn]] void Usage(int rc) {
  fprintf(
      rc == 0 ? stdout : stderr,
      "usage: monarch-pfsemu --source DIR --mount DIR [--latency-us N (1000)]\n"
      "         [--open-latency-us N (1000)] [--bandwidth-mbs N (500, 0 = unlimited)]\n"
      "         [--stat-latency-us N (0)]\n"
      "         [--threads N (64)] [--direct-io | --cached] [--counts FILE] [--foreground]\n"
      "         [--stall-comm THREAD-NAME-PREFIX] [--attr-timeout-ms N (1000)] [--inode-paths]\n"
      "         [--allow-other]\n");
  exit(rc);
}

[[noreturn]] void BadInput(const std::string& msg) {
  fprintf(stderr, "monarch-pfsemu: %s\n", msg.c_str());
  exit(2);
}

uint64_t ParseCount(const std::string& opt, const std::string& v, uint64_t min) {
  char* end = nullptr;
  errno = 0;
  unsigned long long x = strtoull(v.c_str(), &end, 10);
  if (v.empty() || !isdigit(static_cast<unsigned char>(v[0])) || *end != '\0' || errno != 0 ||
      x < min || x > 1000000000ULL)
    BadInput("invalid value for " + opt + ": '" + v + "' (expected an integer from " +
             std::to_string(min) + " to 1000000000)");
  return x;
}

// Absolute path of directory `path`, given to `opt` as `shown`.
std::string RealDir(const std::string& opt, const std::string& path, const std::string& shown) {
  char buf[PATH_MAX];
  struct stat st;
  if (realpath(path.c_str(), buf) == nullptr || stat(buf, &st) != 0)
    BadInput("invalid value for " + opt + ": '" + shown + "': " + strerror(errno));
  if (!S_ISDIR(st.st_mode))
    BadInput("invalid value for " + opt + ": '" + shown + "' is not a directory");
  return buf;
}

void ParseArgs(int argc, char** argv) {
  const std::map<std::string, std::string*> paths{{"--source", &g_opt.source},
                                                  {"--mount", &g_opt.mount},
                                                  {"--counts", &g_opt.counts},
                                                  {"--stall-comm", &g_opt.stall_comm}};
  const std::map<std::string, std::pair<uint64_t*, uint64_t>> numbers{
      // option -> (value, min)
      {"--latency-us", {&g_opt.latency_us, 0}},
      {"--open-latency-us", {&g_opt.open_latency_us, 0}},
      {"--stat-latency-us", {&g_opt.stat_latency_us, 0}},
      {"--bandwidth-mbs", {&g_opt.bandwidth_mbs, 0}},
      {"--attr-timeout-ms", {&g_opt.attr_timeout_ms, 0}},
      {"--threads", {&g_opt.threads, 1}}};
  bool saw_direct = false, saw_cached = false;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i], value;
    if (arg == "--help" || arg == "-h") Usage(0);
    const size_t eq = arg.find('=');
    const bool inline_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg.resize(eq);
    } else if ((paths.count(arg) || numbers.count(arg)) && i + 1 < argc) {
      value = argv[++i];
    } else if (paths.count(arg) || numbers.count(arg)) {
      BadInput("missing value for " + arg);
    }
    if (paths.count(arg)) {
      *paths.at(arg) = value;
    } else if (numbers.count(arg)) {
      *numbers.at(arg).first = ParseCount(arg, value, numbers.at(arg).second);
    } else if (!inline_value && (arg == "--direct-io" || arg == "--cached")) {
      (arg == "--cached" ? saw_cached : saw_direct) = true;
    } else if (!inline_value && arg == "--foreground") {
      g_opt.foreground = true;
    } else if (!inline_value && arg == "--inode-paths") {
      g_opt.inode_paths = true;
    } else if (!inline_value && arg == "--allow-other") {
      g_opt.allow_other = true;
    } else {
      BadInput("unknown argument '" + std::string(argv[i]) + "' (see --help)");
    }
  }
  if (saw_direct && saw_cached) BadInput("--direct-io and --cached are mutually exclusive");
  g_opt.direct_io = !saw_cached;
  if (g_opt.source.empty()) BadInput("missing --source DIR");
  if (g_opt.mount.empty()) BadInput("missing --mount DIR");
  g_opt.source = RealDir("--source", g_opt.source, g_opt.source);
  g_opt.mount = RealDir("--mount", g_opt.mount, g_opt.mount);
  if (!g_opt.counts.empty()) {  // absolute, because the daemon changes to /
    const size_t slash = g_opt.counts.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : g_opt.counts.substr(0, slash + 1);
    g_opt.counts = RealDir("--counts", dir, g_opt.counts) + "/" + g_opt.counts.substr(slash + 1);
    if (!WriteCountsFile())
      BadInput("invalid value for --counts: cannot write '" + g_opt.counts +
               "': " + strerror(errno));
  }
}

}  // namespace

int main(int argc, char** argv) {
  // SIGUSR1 is consumed only by SignalThread's sigwait; block it before any thread exists.
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);

  ParseArgs(argc, argv);
  g_root.fd = open(g_opt.source.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (g_root.fd < 0) BadInput("cannot open --source '" + g_opt.source + "': " + strerror(errno));

  std::string mount_opts = "ro,default_permissions,fsname=pfsemu,subtype=pfsemu";
  if (geteuid() == 0 || g_opt.allow_other) mount_opts += ",allow_other";
  char* fuse_argv[] = {argv[0], const_cast<char*>("-o"), mount_opts.data()};
  fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);

  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.lookup = OnLookup;
  ops.forget = OnForget;
  ops.forget_multi = OnForgetMulti;
  ops.getattr = OnGetattr;
  ops.readlink = OnReadlink;
  ops.open = OnOpen;
  ops.read = OnRead;
  ops.release = OnRelease;
  ops.opendir = OnOpendir;
  ops.readdir = OnReaddir;
  ops.releasedir = OnReleasedir;
  ops.statfs = OnStatfs;

  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  fuse_opt_free_args(&args);
  if (se == nullptr) return 1;
  g_session = se;
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, g_opt.mount.c_str()) != 0) {
    fprintf(stderr, "monarch-pfsemu: cannot mount %s\n", g_opt.mount.c_str());
    return 1;
  }
  const fuse_custom_io io{IoWritev, IoRead, nullptr, nullptr};
  if (fuse_session_custom_io(se, &io, fuse_session_fd(se)) != 0) {
    fuse_session_unmount(se);
    return 1;
  }
  fuse_daemonize(g_opt.foreground ? 1 : 0);

  // Like libfuse's workers, the signal thread leaves termination signals to the main thread.
  sigset_t term, old;
  sigemptyset(&term);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGQUIT}) sigaddset(&term, s);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  std::thread signal_thread(SignalThread);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);

  prctl(PR_SET_TIMERSLACK, 1UL);  // inherited by the workers: emulated delays within ~1 us
  fuse_loop_config* cfg = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(cfg, static_cast<unsigned>(g_opt.threads));
  const int rc = fuse_session_loop_mt(se, cfg);
  fuse_loop_cfg_destroy(cfg);

  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  if (!WriteCountsFile()) perror("monarch-pfsemu: writing counts file");
  fuse_session_destroy(se);  // closes /dev/fuse, which also unblocks a pending RaiseReadahead
  g_stop = true;
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  return rc < 0 ? 1 : 0;  // a positive rc is the signal that ended the loop
}
