#include "process.h"

#include <fcntl.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "client.h"
#include "decimal.h"
#include "fdtable.h"
#include "handlers.h"
#include "mappings.h"
#include "serve.h"

namespace monarch {

constinit Process P{};

namespace {

pid_t real_pid() {
  return pid_t(syscall(SYS_getpid));
}

// Recomputes the current-directory hint after a chdir (owner only).
void update_cwd_hint() {
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) {
    P.cwd_related = true;  // unknown: resolve relative paths each time (getcwd decides)
    return;
  }
  size_t n = std::strlen(cwd);
  const Located& l = located();
  bool related = std::strcmp(cwd, "/") == 0;
  for (int i = 0; i < l.views; ++i)
    related |= has_prefix(cwd, l.view[i], l.len[i]) || has_prefix(l.view[i], cwd, n);
  // Until the map is loaded the real root is unknown: stay pessimistic.
  P.cwd_related = related || !P.map.load();
}

// Calls fn(prefix, lstat of it or null) for each directory on the absolute
// `path` of length `len` and for the path itself ("/a", "/a/b", ...), while
// fn returns true. False when fn stopped it or the path does not fit.
template <typename Fn>
bool each_prefix(const char* path, size_t len, Fn fn) {
  char prefix[kPathMax];
  if (len >= sizeof prefix) return false;
  for (size_t i = 1; i <= len; ++i) {
    if (i < len && path[i] != '/') continue;
    std::memcpy(prefix, path, i);
    prefix[i] = 0;
    struct stat st;
    if (!fn(prefix, real::lstat(prefix, &st) == 0 ? &st : nullptr)) return false;
  }
  return true;
}

void find_ancestors() {
  int n = 0;
  const Located& l = located();
  for (int v = 0; v < l.views; ++v)
    each_prefix(l.view[v], l.len[v], [&n](const char* prefix, struct stat* st) {
      if (n >= Process::kAncestors - 1) return false;
      if (!st) return true;
      P.ancestors[n++] = {uint64_t(st->st_dev), st->st_ino};
      if (S_ISLNK(st->st_mode) && real::stat(prefix, st) == 0 && n < Process::kAncestors)
        P.ancestors[n++] = {uint64_t(st->st_dev), st->st_ino};
      return true;
    });
  P.ancestor_count = n;
}

// Calls fn(fd) for each descriptor of this process, read with getdents64
// (opendir would malloc: this runs inside open, which a signal handler may call).
template <class Fn>
void for_each_open_fd(Fn fn) {
  int dir = real::open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return;
  alignas(8) char buf[4096];
  for (long n; (n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0;) {
    for (long at = 0; at < n;) {
      const char* name = buf + at + 19;  // linux_dirent64: ino 8, off 8, reclen 2, type 1
      at += *reinterpret_cast<const unsigned short*>(buf + at + 16);
      const char* end;
      long fd = long(parse_decimal(name, &end, INT_MAX));
      if (end != name && !*end && fd != dir) fn(int(fd));
    }
  }
  real::close(dir);
}

// Descriptors this process opened for writing before the map was published
// (a shell's "exec 3<>file" at the job's start): their files are stale.
void writers_already_open(JobMap* m) {
  for_each_open_fd([m](int fd) {
    int fl = real::fcntl(fd, F_GETFL);
    struct stat st;
    if (fl >= 0 && (fl & O_ACCMODE) != O_RDONLY && real::fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
      mark_stale_inode(m, st);
  });
}

// Whether the job directory lies on a FUSE mount, or has one below it (on
// its map, say), judged from /proc/self/mountinfo, which never waits on a
// file system. A user can mount one there, and a daemon that never answers
// would hang every call that looks for the map; Monarch's tiers are
// node-local file systems, so such a directory is not Monarch's. A line too
// long to read whole counts as such a mount. The path is compared as written
// (made lexically clean): a job directory reached through a symbolic link
// is judged by that link's path. Called under P.loading.
bool job_dir_on_fuse() {
  const char* job = P.job_mount_path;
  size_t best = 0, jlen = std::strlen(job);
  bool fuse = false, below = false;
  bool whole = for_each_mount([&](const Mount& m) {
    bool is_fuse = m.type.starts_with("fuse");
    const char* mp = m.point.data();  // NUL-terminated: parse_mount cut the line there
    size_t len = m.point.size();
    if (m.point == "/" || has_prefix(job, mp, len)) {
      if (len >= best) best = len, fuse = is_fuse;  // the deepest; the last of equals is on top
    } else if (is_fuse && has_prefix(mp, job, jlen)) {
      below = true;
    }
  });
  return fuse || below || !whole;  // a line too long to read counts as such a mount
}

// Is `path` the directory (dev, ino)?
bool same_dir(const char* path, uint64_t dev, uint64_t ino) {
  struct stat st;
  return *path && real::stat(path, &st) == 0 && S_ISDIR(st.st_mode) && uint64_t(st.st_dev) == dev &&
         uint64_t(st.st_ino) == ino;
}

// No symbolic link on `path` (absolute): the kernel's ".." from it is its lexical parent.
bool no_links(const char* path) {
  return each_prefix(path, std::strlen(path),
                     [](const char*, struct stat* st) { return st && !S_ISLNK(st->st_mode); });
}

// `s` as a C string in `out`; false when it does not fit.
bool terminated(std::string_view s, char (&out)[kPathMax]) {
  if (s.size() >= sizeof out) return false;
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = 0;
  return true;
}

// Memory for a Located, from the kernel: never freed (a published one may be
// in use by another thread), one per map adopted.
Located* new_located() {
  void* mem = real::mmap(nullptr, sizeof(Located), PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return mem == MAP_FAILED ? nullptr : new (mem) Located{};
}

// Adds `path` as a view if it reaches the directory (dev, ino), the dataset
// root, and is not one yet. Not "/": a dataset that is a process's whole
// tree is no container's.
void add_view(Located& l, uint64_t dev, uint64_t ino, std::string_view path) {
  char p[kPathMax];
  if (l.views >= kViews || path.size() < 2 || !terminated(path, p)) return;
  for (int i = 0; i < l.views; ++i)
    if (std::strcmp(l.view[i], p) == 0) return;
  if (!same_dir(p, dev, ino)) return;
  // The kernel's own name for it: what /proc/self/fd shows of a file opened through it.
  int fd = real::open(p, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  char link[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  int i = l.views;
  ssize_t n = real::readlink(link, l.real[i], sizeof l.real[i] - 1);
  real::close(fd);
  if (n <= 0 || l.real[i][0] != '/') return;
  l.real[i][n] = 0;
  l.views++;
  std::memcpy(l.view[i], p, path.size() + 1);
  l.len[i] = path.size();
  l.physical[i] = no_links(p);
}

// Does what the kernel shows at `point` (a mount point) differ from what the
// index holds at `rel` below the root? Nothing indexed there: no.
bool shows_other(const JobMap& m, const char* point, std::string_view rel) {
  int64_t f = m.find(rel), d = f >= 0 ? -1 : m.find_dir(rel);
  if (f < 0 && d < 0) return false;
  struct stat st;
  if (real::stat(point, &st) != 0) return true;
  if (f >= 0) {
    const Attr* a = m.attr(uint32_t(f));
    return !a || a->dev != uint64_t(st.st_dev) || m.entry(uint32_t(f)).ino != uint64_t(st.st_ino);
  }
  const DirEntry& e = m.dir(uint32_t(d));
  return e.dev != uint64_t(st.st_dev) || e.ino != uint64_t(st.st_ino);
}

// Do the directories where the stager's walk crossed into another file
// system (a directory on another device than its parent's) show the same
// directories below `base` here? A container that binds the dataset without
// its submounts shows what lies under them instead.
bool index_mounts_here(const JobMap& m, const char* base) {
  bool one_device = true;  // most datasets: no parent to look up at all
  for (uint64_t d = 0; d < m.dirs() && one_device; ++d)
    one_device = m.dir(uint32_t(d)).dev == m.root_dev();
  if (one_device) return true;
  for (uint64_t d = 0; d < m.dirs(); ++d) {
    const DirEntry& e = m.dir(uint32_t(d));
    std::string_view rel = m.dir_path(uint32_t(d));
    if (rel.empty()) return false;
    size_t slash = rel.rfind('/');
    uint64_t parent = m.root_dev();
    if (slash != std::string_view::npos) {
      int64_t p = m.find_dir({rel.data(), slash});
      if (p < 0) return false;
      parent = m.dir(uint32_t(p)).dev;
    }
    if (e.dev == parent) continue;
    char path[2 * kPathMax];
    int n = std::snprintf(path, sizeof path, "%s/%.*s", base, int(rel.size()), rel.data());
    struct stat st;
    if (n <= 0 || size_t(n) >= sizeof path || real::stat(path, &st) != 0 ||
        uint64_t(st.st_dev) != e.dev || uint64_t(st.st_ino) != e.ino)
      return false;
  }
  return true;
}

// Drops the views through which this namespace shows other files than the
// index holds: a mount inside one that shows another file or directory (a
// container's second bind over /data/sub), or a file system the index
// crossed that is not mounted there. Monarch would serve the index's bytes
// where the kernel reads others. Mount points are the kernel's names: each
// view is judged by its own (`real`). Only the views from `first` on are
// judged (those before it were, and descriptors name them by their index).
void drop_shadowed(Located& l, const JobMap& m, int first = 0) {
  bool shadowed[kViews] = {};
  for (int i = first; i < l.views; ++i) shadowed[i] = !index_mounts_here(m, l.real[i]);
  for_each_mount([&](const Mount& mt) {
    for (int i = first; i < l.views; ++i) {
      const char* point = mt.point.data();  // NUL-terminated: parse_mount cut the line there
      size_t len = std::strlen(l.real[i]), skip = len + 1;  // the view and its '/'
      if (mt.point.size() > skip && has_prefix(point, l.real[i], len) &&
          shows_other(m, point, {point + skip, mt.point.size() - skip}))
        shadowed[i] = true;
    }
  });
  int kept = 0;
  for (int i = 0; i < l.views; ++i) {
    if (shadowed[i]) {
      note(
          "%s shows other files than the dataset's below it (mounts): paths through it are "
          "read from the PFS",
          l.view[i]);
      continue;
    }
    if (kept != i) {
      std::memcpy(l.view[kept], l.view[i], l.len[i] + 1);
      std::memcpy(l.real[kept], l.real[i], std::strlen(l.real[i]) + 1);
      l.len[kept] = l.len[i];
      l.physical[kept] = l.physical[i];
    }
    ++kept;
  }
  l.views = kept;
  l.pfs = 0;
  for (int i = 0; i < l.views; ++i)
    if (l.physical[i]) {
      l.pfs = i;
      break;
    }
}

// Tier t's job directory as this process sees it: `given` (the environment's),
// the map's path, or where mountinfo shows the tier's file system.
void find_tier(Located& l, const JobMap& m, uint32_t t, const char* given) {
  uint64_t dev = m.tier_dev(t), ino = m.tier_ino(t);
  auto take = [&](std::string_view path) {
    char p[kPathMax];
    if (!l.tier[t][0] && terminated(path, p) && same_dir(p, dev, ino))
      std::memcpy(l.tier[t], p, path.size() + 1);
  };
  if (given) take(given);
  take(m.tier_dir(t));
  if (!l.tier[t][0])
    for_each_mount([&](const Mount& mt) {
      if (on_device(mt, dev)) mount_candidates(mt, m.tier_dir(t), take);
    });
}

// The i-th entry of a colon-separated list, or null.
const char* list_entry(const char* list, uint32_t i, char* out, size_t cap) {
  for (uint32_t at = 0; list; ++at) {
    const char* end = std::strchr(list, ':');
    size_t n = end ? size_t(end - list) : std::strlen(list);
    if (at == i) {
      if (n == 0 || n >= cap) return nullptr;
      std::memcpy(out, list, n);
      out[n] = 0;
      return out;
    }
    list = end ? end + 1 : nullptr;
  }
  return nullptr;
}

// Adds the views where mountinfo shows the file system of the directory
// (dev, ino), whose real path (on some namespace's side) is `real_path`.
void add_mount_views(Located& l, uint64_t dev, uint64_t ino, const char* real_path) {
  for_each_mount([&](const Mount& mt) {
    if (on_device(mt, dev))
      mount_candidates(mt, real_path, [&](std::string_view c) { add_view(l, dev, ino, c); });
  });
}

// Where the dataset of `m` and its tiers are in this namespace.
const Located* locate(const JobMap& m) {
  Located* l = new_located();
  if (!l) return nullptr;
  uint64_t dev = m.root_dev(), ino = m.root_ino();
  add_view(*l, dev, ino, {P.root, P.root_len});
  add_view(*l, dev, ino, m.root());
  add_view(*l, dev, ino, m.real_root());
  add_mount_views(*l, dev, ino, m.real_root());
  drop_shadowed(*l, m);
  for (uint32_t t = 0; t < m.tiers() && t < uint32_t(kMapTiers); ++t)
    find_tier(*l, m, t, t == 0 ? P.job_dir : P.job_dirs[t]);
  return l;
}

// What a container hides from this process, said once per process: the
// reads it concerns go to the PFS.
void say_hidden(const JobMap& m, const Located& l) {
  bool hidden = l.views == 0;
  for (uint32_t t = 0; t < m.tiers(); ++t) hidden |= !l.tier[t][0];
  // Once per process, and once per node: the map says whether another said it.
  if (!hidden || P.hidden_noted.exchange(1) || m.header().said_hidden.exchange(1)) return;
  if (l.views == 0)
    say("monarch: the dataset %s is not visible in this process as a whole (a container that "
        "mounts a part of it?): its files are read from the PFS",
        m.root());
  for (uint32_t t = 0; t < m.tiers(); ++t)
    if (!l.tier[t][0])
      say("monarch: the job directory %s is not visible in this process (a container that does "
          "not mount it?): copies there are read from the PFS instead",
          m.tier_dir(t));
}

JobMap* load_map() {
  uint64_t now = monotonic_ns();
  if (now < P.next_load_ns.load()) return P.map.load();
  // A vfork child runs in its parent's memory: a map it adopted would skip
  // what only the owner does on adopting one (writers_already_open...).
  if (!owner()) return P.map.load();
  if (P.loading.exchange(1)) {
    // Another thread loads it: its map, once there, is this call's too (a
    // thread that went on without it would read that file behind Monarch's
    // back for good). A load takes microseconds; the wait is bounded.
    for (int i = 0; i < 1000 && P.loading.load(); ++i) {
      struct timespec ms {
        0, 50'000
      };
      nanosleep(&ms, nullptr);
    }
    return P.map.load();
  }
  NoCancel no_cancel;  // `loading` is held across opens and reads
  JobMap* result = P.map.load();
  // Until the first map is there (the stager indexes while the job starts),
  // look often: the job switches to copies within milliseconds of it. After,
  // only a restarted stager brings another: look rarely. Set when this look
  // is over: meanwhile the other threads wait for it.
  uint64_t next = now + (result ? 500'000'000 : 5'000'000);
  if (job_dir_on_fuse()) {
    if (!P.fuse_noted.exchange(1))
      note("%s is on a FUSE mount, not a node-local tier: reading from the PFS", P.job_dir);
    P.next_load_ns = next;
    P.loading = 0;
    return result;
  }
  char path[kPathMax + 16];
  std::snprintf(path, sizeof path, "%s/%s", P.job_dir, kIndexName);
  int fd = real::open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  // Only a map of this process's own user, that nobody else can write: in a
  // shared tier (mode 1777) another user could have made the job directory
  // first and put a map of theirs there, pointing reads at their bytes.
  bool owned = fd >= 0 && real::fstat(fd, &st) == 0 &&
               (st.st_uid == geteuid() || st.st_uid == getuid()) && !(st.st_mode & 022);
  if (fd >= 0 && !owned && !P.owner_noted.exchange(1))
    note("%s is not this user's own file: reading from the PFS", path);
  if (fd < 0 && errno != ENOENT && !P.owner_noted.exchange(1)) {
    // Read-only (a container's read-only bind), or not this user's: the
    // library writes to the map (states, counters); Monarch stays off here.
    say("monarch: cannot open the job map %s: %s: this process reads from the PFS", path,
        std::strerror(errno));
    P.seeking = false;
  }
  if (owned && (!result || st.st_ino != P.index_ino) && S_ISREG(st.st_mode) &&
      size_t(st.st_size) >= sizeof(Header)) {
    void* base = real::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    // The JobMap itself in a page of its own, not from malloc: the first
    // look may come from a signal handler's open, which must stay
    // async-signal-safe as the kernel's is.
    void* mem = base == MAP_FAILED ? MAP_FAILED
                                   : real::mmap(nullptr, sizeof(JobMap), PROT_READ | PROT_WRITE,
                                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base != MAP_FAILED && mem == MAP_FAILED) munmap(base, st.st_size), base = MAP_FAILED;
    if (base != MAP_FAILED) {
      auto* m = new (mem) JobMap(base, st.st_size);
      std::string_view why = m->why();
      // The dataset as given, by its path string or by what it is.
      if (why.empty() && std::strcmp(m->root(), P.root) != 0 &&
          !same_dir(P.root, m->root_dev(), m->root_ino()))
        why = "another dataset";
      // A job directory found by its name alone may be another job's, left
      // behind: only a map whose stager runs is this job's.
      if (why.empty() && P.job_dir_by_mount && !m->stager_alive(monotonic_ns()))
        why = "its stager is not running (another job's directory of the same name?)";
      // Last: a Located is never freed (see new_located), so none for a refused map.
      const Located* l = why.empty() ? locate(*m) : nullptr;
      if (why.empty() && !l) why = "no memory";
      if (why.empty()) {
        // Maps are never unmapped: descriptors opened under an older one still use it.
        P.located = l;
        P.index_ino = st.st_ino;
        P.map = m;
        P.seeking = false;
        result = m;
        // This process uses Monarch: what the stager's report tells from "no
        // process of the job used it" (Header::attached).
        Header& h = m->header();
        if (h.attached.fetch_add(1, std::memory_order_relaxed) == 0) {
          prctl(PR_GET_NAME, h.first_attached_comm);
          h.first_attached_ns.store(now, std::memory_order_relaxed);
          h.first_attached_pid.store(real_pid(), std::memory_order_release);
        }
        if (owner()) {
          update_cwd_hint();  // the real root is known now
          find_ancestors();
          writers_already_open(m);
        }
        note("using the job map of %s (%llu files)", P.root, (unsigned long long)m->size());
        for (int i = 0; i < l->views; ++i)
          note("the dataset is at %s here%s", l->view[i],
               l->physical[i] ? "" : " (through a link)");
        say_hidden(*m, *l);
      } else {
        note("ignoring %s: %.*s; reading from the PFS", path, int(why.size()), why.data());
        munmap(base, st.st_size);
        m->~JobMap();
        munmap(mem, sizeof(JobMap));
      }
    }
  } else if (!result) {
    note("no job map at %s yet; reading from the PFS", path);
  }
  if (fd >= 0) real::close(fd);
  P.next_load_ns = next;
  P.loading = 0;
  return result;
}

// Descriptors of the job's copies this process inherited through exec (a
// shell's redirection, a pass_fds): tracked like the copies they are. And
// descriptors open for writing below the dataset's root: an open for
// writing is a change only once it writes through a descriptor the table
// knows (open.cpp), and this program's table knows none of them, so their
// files are changed now (writers_already_open, when the map is adopted).
void adopt_inherited() {
  char marker[kPathMax + 16];
  std::snprintf(marker, sizeof marker, "/%s/data/", P.job_name);
  char root[PATH_MAX] = "";  // the root's real path: looked up at the first writer only
  bool writer = false;
  for_each_open_fd([&](int fd) {
    char link[64], target[PATH_MAX];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = real::readlink(link, target, sizeof target - 1);
    if (n <= 0) return;
    target[n] = 0;
    if (std::strstr(target, marker) && current_map()) {  // (cheap test first)
      track_copy(fd, true);
    } else if (!writer && target[0] == '/' && (real::fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDONLY) {
      if (!root[0] && !realpath(P.root, root)) std::strcpy(root, P.root);
      writer =
          has_prefix(target, root, std::strlen(root)) || has_prefix(target, P.root, P.root_len);
    }
  });
  if (writer) current_map();
}

void after_fork_child() {
  P.pid = real_pid();
  P.loading = 0;
  t_slot = {};  // the forking thread's slot stays the parent's
  maps_after_fork();
  for_each_tracked([](int, FdEntry* e) {
    e->lock.clear();
    e->shared = true;  // one open file, two processes: offsets move under each other
  });
}

void after_fork_parent() {
  for_each_tracked([](int, FdEntry* e) { e->shared = true; });
}

}  // namespace

bool root_ancestor(const struct stat& st) {
  int n = P.ancestor_count.load();
  for (int i = 0; i < n; ++i)
    if (P.ancestors[i].dev == uint64_t(st.st_dev) && P.ancestors[i].ino == st.st_ino) return true;
  return false;
}

int magic_fd(const char* path) {
  if (!path || (std::strncmp(path, "/proc/", 6) != 0 && std::strncmp(path, "/dev/", 5) != 0))
    return -1;
  const char* n = nullptr;
  if (std::strncmp(path, "/proc/self/fd/", 14) == 0) {
    n = path + 14;
  } else if (std::strncmp(path, "/proc/thread-self/fd/", 21) == 0) {
    n = path + 21;
  } else if (std::strncmp(path, "/dev/fd/", 8) == 0) {
    n = path + 8;
  } else if (std::strcmp(path, "/dev/stdin") == 0) {
    return 0;
  } else if (std::strcmp(path, "/dev/stdout") == 0) {
    return 1;
  } else if (std::strcmp(path, "/dev/stderr") == 0) {
    return 2;
  } else if (std::strncmp(path, "/proc/", 6) == 0) {
    const char* end;
    long pid = long(parse_decimal(path + 6, &end, INT_MAX));
    if (end == path + 6 || pid != P.pid.load() || std::strncmp(end, "/fd/", 4) != 0) return -1;
    n = end + 4;
  } else {
    return -1;
  }
  // As the kernel reads it: decimal digits only, no sign, space or leading zero.
  long fd = 0;
  for (const char* c = n; *c; ++c) {
    if (*c < '0' || *c > '9' || (c == n && *c == '0' && c[1]) || fd >= kTableLimit) return -1;
    fd = fd * 10 + (*c - '0');
  }
  return *n && fd < kTableLimit ? int(fd) : -1;
}

bool names_a_copy(int fd, JobMap*& m, uint32_t& file, uint32_t& tier) {
  m = P.map.load();
  if (!m) return false;
  char link[64], target[PATH_MAX];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = real::readlink(link, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = 0;
  static constexpr char kDeleted[] = " (deleted)";
  if (size_t(n) > sizeof kDeleted && std::strcmp(target + n - (sizeof kDeleted - 1), kDeleted) == 0)
    target[n - (sizeof kDeleted - 1)] = 0;
  const Located& l = located();
  for (uint32_t t = 0; t < m->tiers(); ++t) {
    size_t len = std::strlen(l.tier[t]);
    if (!len || std::strncmp(target, l.tier[t], len) != 0 ||
        std::strncmp(target + len, "/data/", 6) != 0)
      continue;
    int64_t f = m->find(target + len + 6);
    if (f < 0) return false;
    file = uint32_t(f);
    tier = t;
    return true;
  }
  return false;
}

bool owner() {
  return real_pid() == P.pid.load(std::memory_order_relaxed);
}

JobMap* current_map() {
  JobMap* m = P.map.load(std::memory_order_acquire);
  return m ? m : load_map();
}

void reload_map() {
  load_map();
}

namespace {

void write_line(const char* prefix, const char* fmt, va_list ap) {
  int saved = errno;
  char buf[1024];
  int n = std::snprintf(buf, sizeof buf, "%s", prefix);
  n += std::vsnprintf(buf + n, sizeof buf - n, fmt, ap);
  if (n > int(sizeof buf) - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  (void)!syscall(SYS_write, 2, buf, n);
  errno = saved;
}

}  // namespace

void note(const char* fmt, ...) {
  if (!P.log) return;
  char prefix[32];
  std::snprintf(prefix, sizeof prefix, "monarch[%d]: ", int(P.pid.load()));
  va_list ap;
  va_start(ap, fmt);
  write_line(prefix, fmt, ap);
  va_end(ap);
}

void say(const char* fmt, ...) {
  struct stat st;
  if (P.quiet || real::fstat(2, &st) != 0 || uint64_t(st.st_dev) != P.stderr_dev ||
      uint64_t(st.st_ino) != P.stderr_ino)
    return;
  P.said = true;
  va_list ap;
  va_start(ap, fmt);
  write_line("", fmt, ap);
  va_end(ap);
}

Views Located::as_views() const {
  Views v;
  for (int i = 0; i < views; ++i) v.v[v.n++] = {std::string_view(view[i], len[i]), physical[i]};
  return v;
}

namespace {

// Before any map, where the path given is a directory here: the other
// paths that show it (a container's /data that also sees the host path, as
// Apptainer binds $HOME and /tmp), so that opens there find the map as opens
// under the path given do. Checked again against the map when it comes.
// Called under P.loading. False where the path given is no directory here.
bool early_views() {
  struct stat st;
  if (real::stat(P.root, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  Located* l = new_located();
  if (!l) return false;
  P.root_dev_hint = uint64_t(st.st_dev);
  add_view(*l, st.st_dev, st.st_ino, {P.root, P.root_len});
  if (l->views == 1) add_mount_views(*l, st.st_dev, st.st_ino, l->real[0]);
  if (l->views == 0) std::memcpy(l, &located(), sizeof *l);  // unreadable: the path given only
  P.located = l;
  update_cwd_hint();
  return true;
}

}  // namespace

void seek_map() {
  // Never waits for a load under way (this thread's own, in a signal
  // handler, would never end), and costs at most a few percent of a thread:
  // a node with thousands of mounts makes a look slow. A vfork child never
  // changes its parent's state.
  uint64_t now = monotonic_ns();
  if (now < P.next_seek_ns.load(std::memory_order_relaxed) || P.loading.load() || !owner()) return;
  P.next_seek_ns = now + 50'000'000;
  if (!P.early_done.exchange(true) && !P.map.load() && !P.loading.exchange(1)) {
    bool here = early_views();
    P.loading = 0;
    if (here) {  // from now on, opens under the views look for the map, as they always did
      P.seeking = false;
      return;
    }
  }
  current_map();
  uint64_t took = monotonic_ns() - now;
  P.next_seek_ns = now + std::max<uint64_t>(50'000'000, 30 * took);
}

Resolved where(int dirfd, const char* path, JobMap*& m, bool any_dirfd) {
  m = nullptr;
  if (!P.enabled || !path || !*path) return {};
  bool relative = path[0] != '/';
  if (relative && dirfd != AT_FDCWD && !any_dirfd) return {};
  if (!relative && outside(dirfd, path)) return {};
  if (relative && dirfd == AT_FDCWD && outside(dirfd, path)) return {};
  m = current_map();
  if (!m) return {};
  char cwd[PATH_MAX];
  std::string_view base;
  if (relative && dirfd == AT_FDCWD) {
    if (!getcwd(cwd, sizeof cwd)) return {};
    base = cwd;
  } else if (relative) {
    char link[64];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
    ssize_t n = real::readlink(link, cwd, sizeof cwd - 1);
    if (n <= 0 || cwd[0] != '/') return {};
    base = std::string_view(cwd, size_t(n));
    if (base.ends_with(" (deleted)")) return {};
  }
  return resolve(*m, located().as_views(), path, base);
}

int on_process_change(Pass<int> pass) {
  int r = pass();
  if (r == 0 && P.enabled && owner()) {
    P.enabled = false;
    note("credentials, root or namespaces changed: this process reads dataset paths from the PFS");
  }
  return r;
}

void on_chdir_done() {
  if (P.enabled && owner()) update_cwd_hint();
}

namespace {

// The running program's path, for a line that names it.
const char* program(char (&exe)[256]) {
  ssize_t n = real::readlink ? real::readlink("/proc/self/exe", exe, sizeof exe - 1) : -1;
  exe[n > 0 ? n : 0] = 0;
  return *exe ? exe : "this program";
}

// P.job_mount_path: `job` made lexically clean, for job_dir_on_fuse().
void set_job_mount_path(const char* cwd, const char* job) {
  int n = normalize_path(cwd, job, P.job_mount_path, sizeof P.job_mount_path);
  if (n <= 0) std::strcpy(P.job_mount_path, job), n = int(std::strlen(job));
  while (n > 1 && P.job_mount_path[n - 1] == '/') P.job_mount_path[--n] = 0;
}

// Is `path` a directory here?
bool is_dir(std::string_view path) {
  char p[kPathMax];
  struct stat st;
  return !path.empty() && terminated(path, p) && real::stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

// The job directory as this process sees it: `job` itself, or where a mount
// shows it (a container that binds it, or its tier, elsewhere), or `job`
// while its parent is here: the job directory is made while the job starts
// (monarch-run starts the command first). Its identity is checked when the
// map is adopted (tier 0's).
bool find_job_dir(const char* job) {
  P.job_dir_by_mount = false;
  // On FUSE, whose daemon may never answer a stat: not looked at (load_map
  // says why no map is used).
  if (job_dir_on_fuse() || is_dir(job)) return true;
  bool found = false;
  for_each_mount([&](const Mount& m) {
    if (m.type.starts_with("fuse")) return;
    mount_candidates(m, job, [&](std::string_view c) {
      if (!found && is_dir(c) && terminated(c, P.job_dir)) found = P.job_dir_by_mount = true;
    });
  });
  const char* slash = std::strrchr(job, '/');
  return found || (slash && is_dir({job, slash > job ? size_t(slash - job) : 1}));
}

}  // namespace

bool init_process(const char* dataset, const char* job, bool log, const char* job_dirs) {
  P.pid = real_pid();
  P.log = log;
  if (!dataset || !*dataset || !job || !*job) return false;
  char cwd[PATH_MAX] = "";
  if (dataset[0] != '/' && !getcwd(cwd, sizeof cwd)) return false;
  int n = normalize_path(cwd, dataset, P.root, sizeof P.root);
  if (n <= 1 || std::strlen(job) >= sizeof P.job_dir) return false;
  while (n > 1 && P.root[n - 1] == '/') P.root[--n] = 0;
  P.root_len = n;
  std::strcpy(P.job_dir, job);
  const char* base = std::strrchr(job, '/');
  std::strcpy(P.job_name, base ? base + 1 : job);
  for (uint32_t t = 0; t < uint32_t(kMapTiers); ++t)
    if (!list_entry(job_dirs, t, P.job_dirs[t], sizeof P.job_dirs[t])) P.job_dirs[t][0] = 0;
  set_job_mount_path(cwd, job);
  if (!find_job_dir(job)) {
    char exe[256];
    say("monarch: the job directory %s is not visible to %s (pid %d; a container that does not "
        "mount it? see Containers in Monarch's README): it reads %s from the PFS",
        job, program(exe), int(real_pid()), P.root);
    return false;
  }
  job = P.job_dir;
  set_job_mount_path(cwd, job);
  char sock[kPathMax + 16];
  std::snprintf(sock, sizeof sock, "%s/%s", job, kSocketName);
  if (std::strlen(sock) >= sizeof P.addr.sun_path) {
    note("job directory path too long for a socket; copies are made ahead only");
    P.addr_len = 0;
  } else {
    P.addr.sun_family = AF_UNIX;
    std::strcpy(P.addr.sun_path, sock);
    P.addr_len = socklen_t(offsetof(sockaddr_un, sun_path) + std::strlen(sock) + 1);
  }
  // Until a map tells where the dataset is, the root as given is its only view.
  static Located given;
  given = Located{};
  std::memcpy(given.view[0], P.root, P.root_len + 1);
  given.len[0] = P.root_len;
  given.views = 1;
  P.located = &given;
  // Before a map, the first absolute open finds the other paths of the
  // dataset here (early_views); where the path given is no directory here
  // (a container shows the dataset elsewhere), every absolute open looks for
  // the map (rate-limited) instead. A shell or a `sleep` of the job never
  // pays for a map it does not use.
  P.seeking = true;
  P.early_done = false;
  P.enabled = true;
  update_cwd_hint();
  return true;
}

namespace {

// What pthread_atfork calls in glibc (whose pthread_atfork is a static stub
// in libc_nonshared.a), with the library's handle. Weak: musl has none.
extern "C" int __register_atfork(void (*prepare)(), void (*parent)(), void (*child)(), void* dso)
    __attribute__((weak));
extern "C" void* __dso_handle __attribute__((weak));

// A C library other than glibc (musl): the handlers are written for glibc's
// symbols, FILE and stat family. Monarch stays off in such a process, which
// reads from the PFS, and says so in one line where it was asked for.
void refuse_other_libc(const char* dataset) {
  if (!dataset || !*dataset) return;
  char exe[256];
  say("monarch: %s (pid %d) does not use glibc (a musl program?): it reads %s from the PFS",
      program(exe), int(real_pid()), dataset);
}

__attribute__((constructor)) void init() {
  real::resolve();
  // What say() prints once per task: in Slurm's task 0 (the others would
  // repeat it), and not again in the programs it starts.
  const char* rank = getenv("SLURM_PROCID");
  struct stat err;
  P.quiet = (rank && std::strcmp(rank, "0") != 0) || getenv(kEnvSaid) || real::fstat(2, &err) != 0;
  if (!P.quiet) P.stderr_dev = err.st_dev, P.stderr_ino = err.st_ino;
  if (!real::libc_is_glibc()) {
    refuse_other_libc(getenv(kEnvDataset));
  } else {
    const char* log = getenv(kEnvLog);
    if (init_process(getenv(kEnvDataset), getenv(kEnvJobDir), log && *log && std::strcmp(log, "0"),
                     getenv(kEnvJobDirs))) {
      if (__register_atfork)
        __register_atfork(nullptr, after_fork_parent, after_fork_child, __dso_handle);
      adopt_inherited();
    }
  }
  // Said: the programs this one starts need not say it again. (The
  // constructor runs before the program, the only time setenv is safe here.)
  if (P.said) setenv(kEnvSaid, "1", 1);
}

}  // namespace
namespace {

// Makes `root` (a path here, lexically normal) a view of the dataset of `m`,
// the map in use, if it reaches the root (identity) and shows what the index
// holds below it (drop_shadowed). The new Located is published whole; the
// views before it keep their indexes. One thread at a time (P.loading); a
// thread that finds another learning or loading gives up, uncounted (its
// path is learned at a later open).
bool learn_view(const JobMap& m, const char* root) {
  if (!owner() || P.loading.exchange(1)) return false;
  NoCancel no_cancel;  // `loading` is held across stats and reads
  // Built in a scratch copy (one at a time, under P.loading), made a
  // never-freed Located only once it holds a new view.
  static Located scratch;
  const Located& old = located();
  bool learned = false;
  if (P.map.load() == &m && old.views < kViews) {
    std::memcpy(&scratch, &old, sizeof scratch);
    add_view(scratch, m.root_dev(), m.root_ino(), root);
    if (scratch.views > old.views) drop_shadowed(scratch, m, old.views);
    Located* l = scratch.views > old.views ? new_located() : nullptr;
    if (l) {
      std::memcpy(l, &scratch, sizeof *l);
      P.located = l;
      learned = true;
    }
  }
  if (learned) {
    note("the dataset is at %s here%s: a path that opened a dataset file", root,
         located().physical[located().views - 1] ? "" : " (through a link)");
    update_cwd_hint();
    find_ancestors();
  } else {
    P.learn_failed.fetch_add(1);
  }
  P.loading = 0;
  return learned;
}

}  // namespace

void reached(const Resolved& r, int dirfd, const char* path, int flags, int fd, bool stream) {
  if (r.where != Where::kOutside || fd < 0 || !P.enabled || !path || !*path ||
      (path[0] != '/' && dirfd != AT_FDCWD) ||
      (flags & (O_ACCMODE | O_TRUNC | O_CREAT | O_PATH | O_DIRECTORY | O_DIRECT | O_NOATIME)) ||
      (flags & O_TMPFILE) == O_TMPFILE)
    return;
  // The cap: once every view is taken, or learning failed too often, or
  // while nothing tells the dataset's device, an open outside the views
  // costs nothing more than before.
  if (!learning()) return;
  JobMap* m = P.map.load(std::memory_order_acquire);
  uint64_t hint = P.root_dev_hint.load(std::memory_order_relaxed);
  KeepErrno keep;
  struct stat st;
  if (real::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  if (m ? !m->dataset_dev(st.st_dev) : uint64_t(st.st_dev) != hint) return;
  // On the dataset's device: its map (loaded now, at most once per 5 ms,
  // for the process that reads the dataset only through such paths).
  if (!m && (!(m = current_map()) || !m->dataset_dev(st.st_dev))) return;
  bool indexed = false;
  m->for_each_inode(st.st_dev, st.st_ino, [&](uint32_t) { indexed = true; });
  if (!indexed) return;
  // A dataset file. Where its root is along the path: for each of its names
  // in the index (hard links), the prefix the rest of the path is that name.
  char cwd[PATH_MAX] = "";
  if (path[0] != '/' && !getcwd(cwd, sizeof cwd)) return;
  char root[kPathMax] = "";
  m->for_each_inode(st.st_dev, st.st_ino, [&](uint32_t f) {
    if (!root[0]) root_along(cwd, path, m->path(f), root, sizeof root);
  });
  if (!root[0] || !learn_view(*m, root)) return;
  // Through the new view the path resolves as any dataset path does: served
  // when it names, as the kernel would, the very file `fd` is.
  JobMap* now;
  Resolved in = where(dirfd, path, now);
  if (in.where == Where::kFile && now == m && m->entry(in.id).ino == uint64_t(st.st_ino))
    serve_opened(m, in.id, dirfd, path, fd, stream);
}

}  // namespace monarch
