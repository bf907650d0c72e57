#include "process.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fdtable.h"
#include "handlers.h"

namespace monarch {

constinit Process P{};

namespace {

bool has_prefix(const char* path, const char* root, size_t len) {
  return len && std::strncmp(path, root, len) == 0 && (path[len] == '/' || path[len] == 0);
}

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
  size_t n = std::strlen(cwd), rl = P.real_len.load();
  bool related = std::strcmp(cwd, "/") == 0 || has_prefix(cwd, P.root, P.root_len) ||
                 has_prefix(P.root, cwd, n) ||
                 (rl && (has_prefix(cwd, P.real_root, rl) || has_prefix(P.real_root, cwd, n)));
  // Until the map is loaded the real root is unknown: stay pessimistic.
  P.cwd_related = related || !rl;
}

JobMap* load_map() {
  uint64_t now = monotonic_ns();
  if (now < P.next_load_ns.load() || P.loading.exchange(1)) return P.map.load();
  JobMap* result = P.map.load();
  // Until the first map is there (the stager indexes while the job starts),
  // look often: the job switches to copies within milliseconds of it. After,
  // only a restarted stager brings another: look rarely.
  P.next_load_ns = now + (result ? 500'000'000 : 5'000'000);
  char path[kPathMax + 16];
  std::snprintf(path, sizeof path, "%s/%s", P.job_dir, kIndexName);
  int fd = real::open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  struct stat st;
  if (fd >= 0 && real::fstat(fd, &st) == 0 && (!result || st.st_ino != P.index_ino) &&
      S_ISREG(st.st_mode) && size_t(st.st_size) >= sizeof(Header)) {
    void* base = real::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base != MAP_FAILED) {
      auto* m = new JobMap(base, st.st_size);
      std::string_view why = m->why();
      if (why.empty() && std::strcmp(m->root(), P.root) != 0) why = "another dataset";
      if (why.empty()) {
        // Maps are never unmapped: descriptors opened under an older one still use it.
        size_t n = std::strlen(m->real_root());
        std::memcpy(P.real_root, m->real_root(), n + 1);
        P.real_len = n;
        P.index_ino = st.st_ino;
        P.map = m;
        result = m;
        if (owner()) update_cwd_hint();  // the real root is known now
        note("using the job map of %s (%llu files)", P.root, (unsigned long long)m->size());
      } else {
        note("ignoring %s: %.*s; reading from the PFS", path, int(why.size()), why.data());
        munmap(base, st.st_size);
        delete m;
      }
    }
  } else if (!result) {
    note("no job map at %s yet; reading from the PFS", path);
  }
  if (fd >= 0) real::close(fd);
  P.loading = 0;
  return result;
}

// Descriptors of the job's copies this process inherited through exec (a
// shell's redirection, a pass_fds): tracked like the copies they are.
void adopt_inherited() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  int self = dirfd(d);
  char marker[kPathMax + 16];
  std::snprintf(marker, sizeof marker, "/%s/data/", P.job_name);
  while (dirent* e = readdir(d)) {
    char* end;
    long fd = std::strtol(e->d_name, &end, 10);
    if (*end || fd < 0 || fd == self) continue;
    char link[64], target[PATH_MAX];
    std::snprintf(link, sizeof link, "/proc/self/fd/%ld", fd);
    ssize_t n = real::readlink(link, target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = 0;
    // A copy the stager deleted since (the job changed its file) is still one.
    static constexpr char kDeleted[] = " (deleted)";
    if (size_t(n) > sizeof kDeleted &&
        std::strcmp(target + n - (sizeof kDeleted - 1), kDeleted) == 0)
      target[n - (sizeof kDeleted - 1)] = 0;
    const char* at = std::strstr(target, marker);
    if (!at) continue;
    JobMap* m = current_map();
    if (!m) break;
    for (uint32_t t = 0; t < m->tiers(); ++t) {
      size_t len = std::strlen(m->tier_dir(t));
      if (std::strncmp(target, m->tier_dir(t), len) != 0 ||
          std::strncmp(target + len, "/data/", 6) != 0)
        continue;
      int64_t file = m->find(target + len + 6);
      struct stat st;
      if (file < 0 || real::fstat(int(fd), &st) != 0) break;
      if (FdEntry* fe = track(int(fd), m, uint32_t(file), kLocal)) {
        fe->tier = uint8_t(t);
        fe->dev = st.st_dev;
        fe->ino = st.st_ino;
        fe->shared = true;
        fe->direct = real::fcntl(int(fd), F_GETFL) & O_DIRECT;
      }
      break;
    }
  }
  closedir(d);
}

void after_fork_child() {
  P.pid = real_pid();
  P.loading = 0;
  t_slot = {};  // the forking thread's slot stays the parent's
  for_each_tracked([](int, FdEntry* e) {
    e->lock.clear();
    e->shared = true;  // one open file, two processes: offsets move under each other
  });
}

void after_fork_parent() {
  for_each_tracked([](int, FdEntry* e) { e->shared = true; });
}

}  // namespace

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

void note(const char* fmt, ...) {
  if (!P.log) return;
  int saved = errno;
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, "monarch[%d]: ", int(P.pid.load()));
  va_list ap;
  va_start(ap, fmt);
  n += std::vsnprintf(buf + n, sizeof buf - n, fmt, ap);
  va_end(ap);
  if (n > int(sizeof buf) - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  (void)!syscall(SYS_write, 2, buf, n);
  errno = saved;
}

bool outside(int dirfd, const char* path) {
  if (!P.enabled || !path || !*path) return true;
  if (path[0] != '/')  // relative to a directory descriptor: not served
    return dirfd != AT_FDCWD ||
           (!P.cwd_related.load(std::memory_order_relaxed) && !std::strstr(path, ".."));
  size_t rl = P.real_len.load(std::memory_order_relaxed);
  return !has_prefix(path, P.root, P.root_len) && !(rl && has_prefix(path, P.real_root, rl));
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
  return resolve(*m, path, base);
}

void on_chdir_done() {
  if (P.enabled && owner()) update_cwd_hint();
}

bool init_process(const char* dataset, const char* job, bool log) {
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
  P.enabled = true;
  update_cwd_hint();
  return true;
}

namespace {

__attribute__((constructor)) void init() {
  real::resolve();
  const char* log = getenv(kEnvLog);
  if (!init_process(getenv(kEnvDataset), getenv(kEnvJobDir), log && *log && std::strcmp(log, "0")))
    return;
  pthread_atfork(nullptr, after_fork_parent, after_fork_child);
  adopt_inherited();
}

}  // namespace
}  // namespace monarch
