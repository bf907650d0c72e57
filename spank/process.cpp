#include "process.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
// glibc 2.36 declares these without C linkage for C++.
extern "C" {
#include <sys/pidfd.h>
}

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <stdexcept>

#include "fd.h"
#include "jobmap.h"
#include "proc.h"

namespace monarch::spank {
namespace {

// How much longer than its own deadline the caller waits for a child that
// relays an answer, before it kills the child.
constexpr int64_t kRelayGraceMs = 5000;
// How long a killed child gets to be reaped.
constexpr int64_t kReapMs = 2000;

// argv or envp as the char* array execve wants, over strings that stay put.
class CArray {
 public:
  explicit CArray(std::vector<std::string> strings) : strings_(std::move(strings)) {
    for (std::string& s : strings_) ptrs_.push_back(s.data());
    ptrs_.push_back(nullptr);
  }
  CArray(const CArray&) = delete;
  CArray& operator=(const CArray&) = delete;
  char** get() { return ptrs_.data(); }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> ptrs_;
};

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Reaps our own child `pid`, giving it `ms` to exit; false if it did not.
bool reap(pid_t pid, int64_t ms, int* status) {
  int64_t deadline = now_ms() + ms;
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return r == pid;
    if (now_ms() >= deadline) return false;
    struct timespec t = {0, 10'000'000};
    nanosleep(&t, nullptr);
  }
}

// ---- In a forked child: async-signal-safe calls only. ----

void say(int fd, const char* text) {
  if (fd >= 0) (void)!write(fd, text, strlen(text));
}

[[noreturn]] void fail(int fd, const char* what) {
  say(fd, "error: ");
  say(fd, what);
  say(fd, "\n");
  _exit(126);
}

// Clears the signal mask and resets every handler: slurmstepd blocks
// SIGTERM and others in the thread that forks, and both survive exec.
void reset_signals() {
  struct sigaction sa = {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  for (int s = 1; s < NSIG; ++s)
    if (s != SIGKILL && s != SIGSTOP) sigaction(s, &sa, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Becomes the user for good: supplementary groups, then real, effective and
// saved gid and uid, checked afterwards, with no way back to root. Never
// uid 0: nothing the plugin runs for a job runs as root.
bool become(const User& u) {
  if (u.uid == 0) return false;
  if (setgroups(u.groups.size(), u.groups.data()) != 0) return false;
  if (setresgid(u.gid, u.gid, u.gid) != 0 || setresuid(u.uid, u.uid, u.uid) != 0) return false;
  uid_t r, e, s;
  gid_t rg, eg, sg;
  if (getresuid(&r, &e, &s) != 0 || r != u.uid || e != u.uid || s != u.uid) return false;
  if (getresgid(&rg, &eg, &sg) != 0 || rg != u.gid || eg != u.gid || sg != u.gid) return false;
  if (setuid(0) == 0 || seteuid(0) == 0) return false;
  return true;
}

// `path` relative to the directory `at` (AT_FDCWD: the working directory).
bool write_file(int at, const char* path, const char* text, size_t size, int flags) {
  int fd = openat(at, path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | flags, 0600);
  if (fd < 0) return false;
  bool ok = write(fd, text, size) == ssize_t(size);
  return close(fd) == 0 && ok;
}

bool copy_file(const char* from, int at, const char* to) {
  char buf[4096];
  int fd = open(from, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  return n > 0 && write_file(at, to, buf, size_t(n), 0);
}

// A cgroup the child joins: its directory, and the files copied into it
// first (from a path, to a name in it).
struct PreparedLeaf {
  std::string dir;
  std::vector<std::pair<std::string, std::string>> copies;
};

// What the child does, as strings made before fork.
struct Prepared {
  std::vector<PreparedLeaf> leaves;
  std::string record;  // the dirs, one a line
};

Prepared prepare(const ChildSetup& s) {
  Prepared p;
  for (const CgroupJoin& j : s.cgroups) {
    PreparedLeaf leaf{.dir = j.dir};
    for (const auto& [from, to] : j.copy)
      leaf.copies.emplace_back(from, to.substr(to.rfind('/') + 1));
    p.leaves.push_back(std::move(leaf));
    p.record += j.dir + "\n";
  }
  return p;
}

void set_up_child(const ChildSetup& s, const Prepared& p, int err) {
  // In user_init slurmstepd runs with the user's euid and root's real and
  // saved uid: the child takes root back for what follows.
  if (geteuid() != 0 && getuid() == 0 &&
      (setresuid(0, 0, 0) != 0 || setresgid(0, 0, 0) != 0 || setgroups(0, nullptr) != 0))
    fail(err, "cannot take back root to set the child up");
  reset_signals();
  setsid();
  write_file(AT_FDCWD, "/proc/self/oom_score_adj", "0", 1, 0);  // slurmstepd's is -1000
  // The leaf is held open from its check to the join: Slurm's v1 plugins
  // give the user the job's cgroup, where the user could have made the leaf
  // first (and own its files) or swap root's empty leaf for one of theirs
  // after the check. A swapped leaf has no cgroup.procs under this
  // descriptor, so the join fails and the job runs without Monarch.
  for (const PreparedLeaf& leaf : p.leaves) {
    if (mkdir(leaf.dir.c_str(), 0755) != 0 && errno != EEXIST)
      fail(err, "cannot make the job's Monarch cgroup");
    int dir = open(leaf.dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dir < 0 || fstat(dir, &st) != 0 || st.st_uid != 0)
      fail(err, "cannot make the job's Monarch cgroup (or it exists and is not root's)");
    for (const auto& [from, to] : leaf.copies)
      if (!copy_file(from.c_str(), dir, to.c_str()))
        fail(err, "cannot set the job's Monarch cpuset");
    if (!write_file(dir, "cgroup.procs", "0", 1, 0)) fail(err, "cannot join the job's cgroup");
    close(dir);
  }
  if (!s.cgroup_record.empty() && !p.record.empty() &&
      !write_file(AT_FDCWD, s.cgroup_record.c_str(), p.record.data(), p.record.size(),
                  O_CREAT | O_TRUNC))
    fail(err, "cannot record the job's Monarch cgroup");
  for (const Limit& l : s.limits) {
    struct rlimit r = {l.soft, l.hard};
    setrlimit(l.resource, &r);
  }
  umask(s.umask);
  if (s.user && !become(*s.user)) fail(err, "cannot switch to the job's user");
  if (chdir("/") != 0) fail(err, "cannot change to /");
  // Out of the way of 0-3 first: dup2 onto them then clears close-on-exec.
  int out = s.out >= 0 ? fcntl(s.out, F_DUPFD_CLOEXEC, 10) : -1;
  int keep = s.keep >= 0 ? fcntl(s.keep, F_DUPFD_CLOEXEC, 10) : -1;
  int keep2 = s.keep2 >= 0 ? fcntl(s.keep2, F_DUPFD_CLOEXEC, 10) : -1;
  int null = open("/dev/null", O_RDWR);  // above 4 it goes with close_range
  if (out < 0) out = null;
  if (null < 0 || dup2(null, 0) != 0 || dup2(out, 1) != 1 || dup2(out, 2) != 2 ||
      (s.keep >= 0 && (keep < 0 || dup2(keep, 3) != 3)) ||
      (s.keep2 >= 0 && (keep2 < 0 || dup2(keep2, 4) != 4)))
    fail(err, "cannot set up the child's descriptors");
  close_range(s.keep2 >= 0 ? 5 : s.keep >= 0 ? 4 : 3, ~0U, 0);
}

// The launcher: the child of start_stager, as the user, with the caller's
// pipe on descriptor 3 and the job's key, if any, readable on descriptor 4
// (the stager's --key-fd). Says one of "running", "started", "ready",
// "timeout", "exited" or "error: ..." on 3, and exits.
[[noreturn]] void launcher(char** argv, char** envp, const char* lock_path, bool wait,
                           unsigned timeout_s, bool key) {
  // Checked as the user: a stager of this job holds this lock while it runs.
  // A stager that has exited may hold it a moment longer (its threads still
  // exiting after its main thread is a zombie): that one is waited for,
  // bounded, and a new stager started (a step right after a stager was
  // killed found "running" and ran without one).
  int lock = open(lock_path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (lock >= 0) {
    bool busy = flock(lock, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (busy) {
      char dir[PATH_MAX];
      const char* slash = std::strrchr(lock_path, '/');
      size_t n = slash ? size_t(slash - lock_path) : 0;
      int dfd = -1;
      if (n > 0 && n < sizeof dir) {
        std::memcpy(dir, lock_path, n);
        dir[n] = 0;
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      }
      if (dfd >= 0 && map_stager_exited(dfd)) {
        for (int waited = 0; busy && waited < kExitedStagerWaitMs; waited += 20) {
          struct timespec nap {
            0, 20'000'000
          };
          nanosleep(&nap, nullptr);
          busy = flock(lock, LOCK_SH | LOCK_NB) != 0;
        }
      }
      if (dfd >= 0) close(dfd);
    }
    if (busy) {
      say(3, "running\n");
      _exit(0);
    }
    close(lock);
  }
  int q[2];
  if (pipe2(q, O_CLOEXEC) != 0) fail(3, "cannot make a pipe");
  pid_t stager = fork();
  if (stager < 0) fail(3, "cannot fork the stager");
  if (stager == 0) {
    if (wait) {
      if (dup2(q[1], 3) != 3) _exit(127);  // --ready-fd 3; the caller's pipe is closed
    } else {
      close(3);
    }
    close_range(key ? 5 : 4, ~0U, 0);
    execve(argv[0], argv, envp);
    say(3, "error: cannot execute the stager\n");
    _exit(127);
  }
  close(q[1]);
  if (key) close(4);
  if (!wait) {
    say(3, "started\n");
    _exit(0);
  }
  // The stager's first line is the answer.
  char line[512];
  size_t have = 0;
  struct timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t left = int64_t(timeout_s) * 1000 -
                   ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000);
    struct pollfd pf = {q[0], POLLIN, 0};
    int n = left > 0 ? poll(&pf, 1, int(left)) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // No answer in time: SIGKILL, not SIGTERM, since a stager stuck
      // (stopped, or waiting on a dead file system) would keep a SIGTERM
      // pending and its lock held. Our own child: its pid is still its own.
      kill(stager, SIGKILL);
      say(3, "timeout\n");
      _exit(0);
    }
    ssize_t got = read(q[0], line + have, sizeof line - 1 - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      say(3, "exited\n");
      _exit(0);
    }
    have += size_t(got);
    char* nl = static_cast<char*>(memchr(line, '\n', have));
    if (nl || have == sizeof line - 1) {
      size_t len = nl ? size_t(nl - line) + 1 : have;
      (void)!write(3, line, len);
      if (!nl) say(3, "\n");
      _exit(0);
    }
  }
}

}  // namespace

std::vector<std::string> user_environment(const User& user) {
  std::vector<std::string> env{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + user.home};
  if (!user.name.empty()) env.insert(env.end(), {"USER=" + user.name, "LOGNAME=" + user.name});
  return env;
}

pid_t fork_as_user(const ChildSetup& setup, int error_fd) {
  Prepared p = prepare(setup);
  pid_t pid = fork();
  if (pid != 0) return pid;
  int err = fcntl(error_fd, F_DUPFD_CLOEXEC, 10);
  set_up_child(setup, p, err);
  return 0;
}

StagerStart start_stager(const StagerLaunch& launch) {
  bool wait = launch.timeout_s > 0;
  std::vector<std::string> argv{launch.program, "--job", launch.key};
  argv.insert(argv.end(), launch.args.begin(), launch.args.end());
  if (wait) argv.insert(argv.end(), {"--ready-fd", "3"});
  bool key = !launch.secret.empty();
  if (key) argv.insert(argv.end(), {"--key-fd", "4"});
  CArray args(argv), env(launch.env);

  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0)
    return {StagerState::kFailed, std::string("cannot make a pipe: ") + std::strerror(errno)};
  Fd from_child(p[0]), to_parent(p[1]);
  // The key waits in a pipe of its own, whole before the stager exists (a
  // pipe holds far more than a key): nobody else can read it there, and it
  // never enters an environment or a command line.
  Fd key_read;
  if (key) {
    int k[2];
    if (pipe2(k, O_CLOEXEC) != 0)
      return {StagerState::kFailed, std::string("cannot make a pipe: ") + std::strerror(errno)};
    key_read = Fd(k[0]);
    Fd key_write(k[1]);
    std::string line = launch.secret + "\n";
    if (write(key_write.get(), line.data(), line.size()) != ssize_t(line.size()))
      return {StagerState::kFailed, std::string("cannot pass the key: ") + std::strerror(errno)};
  }
  ChildSetup setup = launch.setup;
  setup.keep = to_parent.get();
  setup.keep2 = key_read.get();
  pid_t child = fork_as_user(setup, to_parent.get());
  if (child == 0)
    launcher(args.get(), env.get(), launch.lock_path.c_str(), wait, launch.timeout_s, key);
  key_read.reset();
  to_parent.reset();
  if (child < 0) return {StagerState::kFailed, std::string("cannot fork: ") + std::strerror(errno)};

  // One line from the launcher; it has its own deadline, this one is longer.
  std::string buffer;
  int64_t deadline = now_ms() + int64_t(launch.timeout_s) * 1000 + kRelayGraceMs;
  bool eof = false;
  while (!eof && buffer.find('\n') == std::string::npos) {
    pollfd pf{from_child.get(), POLLIN, 0};
    int64_t left = deadline - now_ms();
    int n = left > 0 ? poll(&pf, 1, int(left)) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    char buf[512];
    ssize_t got = read(from_child.get(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) eof = true;
    if (got > 0) buffer.append(buf, size_t(got));
  }
  int status;
  if (!reap(child, kReapMs, &status)) {
    kill(child, SIGKILL);  // our own child, not reaped: its pid is its own
    reap(child, kReapMs, &status);
  }
  std::string line = buffer.substr(0, buffer.find('\n'));
  if (line == "ready") return {StagerState::kReady, ""};
  if (line == "running") return {StagerState::kRunning, ""};
  if (line == "started") return {StagerState::kStarted, ""};
  if (line.starts_with("error: ")) return {StagerState::kFailed, line.substr(7)};
  if (line == "exited")
    return {StagerState::kFailed,
            "the stager exited at start-up without an answer (see its stager.log)"};
  if (line == "timeout")
    return {StagerState::kTimeout, "the stager did not answer within " +
                                       std::to_string(launch.timeout_s) +
                                       " s (start_timeout in the configuration)"};
  return {StagerState::kTimeout, "the stager's start did not report back within " +
                                     std::to_string(launch.timeout_s + kRelayGraceMs / 1000) +
                                     " s"};
}

int stop_stagers(const std::string& program, uid_t uid, const std::string& key,
                 unsigned timeout_s) {
  std::vector<Fd> signalled;
  for (pid_t pid : find_job_stagers(program, uid, key)) {
    Fd fd(pidfd_open(pid, 0));
    // The pidfd names one process for good: check that one again.
    if (fd && is_job_stager(pid, program, uid, key) &&
        pidfd_send_signal(fd.get(), SIGTERM, nullptr, 0) == 0)
      signalled.push_back(std::move(fd));
  }
  int found = int(signalled.size());
  // Waits until every one has exited or the time is up.
  auto wait_exit = [](std::vector<Fd>& fds, int64_t ms) {
    int64_t deadline = now_ms() + ms;
    while (!fds.empty()) {
      std::vector<pollfd> p;
      for (const Fd& fd : fds) p.push_back({fd.get(), POLLIN, 0});
      int64_t left = deadline - now_ms();
      if (left <= 0) break;
      int n = poll(p.data(), p.size(), int(std::min<int64_t>(left, 1000)));
      if (n < 0 && errno != EINTR) break;
      std::vector<Fd> still;
      for (size_t i = 0; i < p.size(); ++i)
        if (!p[i].revents) still.push_back(std::move(fds[i]));
      fds = std::move(still);
    }
  };
  wait_exit(signalled, int64_t(timeout_s) * 1000);
  for (const Fd& fd : signalled) pidfd_send_signal(fd.get(), SIGKILL, nullptr, 0);
  wait_exit(signalled, 5000);
  return found;
}

int run_process(const ChildSetup& setup, const std::vector<std::string>& argv,
                const std::vector<std::string>& env, unsigned timeout_s, std::string& output) {
  CArray args(argv), envp(env);
  output.clear();
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  Fd from_child(p[0]), to_parent(p[1]);
  ChildSetup s = setup;
  s.out = to_parent.get();
  pid_t pid = fork_as_user(s, to_parent.get());
  if (pid == 0) {
    execve(args.get()[0], args.get(), envp.get());
    say(2, "cannot execute the program\n");
    _exit(127);
  }
  to_parent.reset();
  if (pid < 0) return -1;
  int64_t deadline = now_ms() + int64_t(timeout_s) * 1000;
  bool killed = false;
  for (;;) {
    int64_t left = deadline - now_ms();
    pollfd pf{from_child.get(), POLLIN, 0};
    int n = left > 0 ? poll(&pf, 1, int(left)) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {  // our own child, not reaped yet: its pid is still its own
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    char buf[1024];
    ssize_t got = read(from_child.get(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (output.size() < 4096) output.append(buf, size_t(got));
  }
  int status = 0;
  if (!reap(pid, killed ? kReapMs : int64_t(timeout_s) * 1000 + kReapMs, &status)) {
    kill(pid, SIGKILL);
    if (!reap(pid, kReapMs, &status)) return 128 + SIGKILL;
    killed = true;
  }
  if (killed || WIFSIGNALED(status))
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace monarch::spank
