#include "process.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
// glibc 2.36 declares these without C linkage for C++.
extern "C" {
#include <sys/pidfd.h>
}

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace monarch::spank {
namespace {

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

// ---- In a forked child: async-signal-safe calls only. ----

void child_say(int fd, const char* text) {
  if (fd >= 0) (void)!write(fd, text, strlen(text));
}

// Clears the signal mask and resets every handler: slurmstepd blocks SIGTERM
// and others in the thread that forks, and both survive exec.
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
// saved gid and uid, checked afterwards, with no way back to root.
bool become(const User& u) {
  if (setgroups(u.groups.size(), u.groups.data()) != 0) return false;
  if (setresgid(u.gid, u.gid, u.gid) != 0 || setresuid(u.uid, u.uid, u.uid) != 0) return false;
  uid_t r, e, s;
  gid_t rg, eg, sg;
  if (getresuid(&r, &e, &s) != 0 || r != u.uid || e != u.uid || s != u.uid) return false;
  if (getresgid(&rg, &eg, &sg) != 0 || rg != u.gid || eg != u.gid || sg != u.gid) return false;
  if (u.uid != 0 && (setuid(0) == 0 || seteuid(0) == 0)) return false;
  return true;
}

// stdin on /dev/null; stdout and stderr on `out`, or /dev/null when out < 0.
bool stdio_to(int out) {
  int null = open("/dev/null", O_RDWR);
  if (null < 0) return false;
  if (out < 0) out = null;
  bool ok = dup2(null, 0) == 0 && dup2(out, 1) == 1 && dup2(out, 2) == 2;
  if (null > 2) close(null);
  return ok;
}

// "pid 123\n" without snprintf.
void child_say_pid(int fd, pid_t pid) {
  char buf[32] = "pid ";
  char digits[16];
  int n = 0;
  do digits[n++] = char('0' + pid % 10), pid /= 10;
  while (pid > 0 && n < 15);
  int at = 4;
  while (n > 0) buf[at++] = digits[--n];
  buf[at++] = '\n';
  buf[at] = 0;
  child_say(fd, buf);
}

// ---- /proc ----

bool read_small_file(const std::string& path, std::string& out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  out.clear();
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0 && out.size() < (1 << 20)) out.append(buf, size_t(n));
  close(fd);
  return n == 0;
}

// Is `pid` a live stager of job `key`, running as `uid` from `program`?
bool is_job_stager(pid_t pid, const std::string& program, uid_t uid, const std::string& key) {
  std::string base = "/proc/" + std::to_string(pid), status, cmdline;
  if (!read_small_file(base + "/status", status)) return false;
  bool uid_ok = false;
  size_t at = 0;
  while (at < status.size()) {
    size_t end = status.find('\n', at);
    if (end == std::string::npos) end = status.size();
    std::string line = status.substr(at, end - at);
    at = end + 1;
    if (line.starts_with("State:") && line.find('Z') != std::string::npos &&
        line.find("zombie") != std::string::npos)
      return false;
    if (line.starts_with("Uid:")) {
      unsigned long ids[4];
      if (std::sscanf(line.c_str(), "Uid: %lu %lu %lu %lu", &ids[0], &ids[1], &ids[2], &ids[3]) != 4)
        return false;
      uid_ok = ids[0] == uid && ids[1] == uid && ids[2] == uid && ids[3] == uid;
    }
  }
  if (!uid_ok) return false;
  char exe[PATH_MAX];
  ssize_t n = readlink((base + "/exe").c_str(), exe, sizeof exe - 1);
  if (n <= 0) return false;
  std::string exe_path(exe, size_t(n));
  if (exe_path != program && exe_path != program + " (deleted)") return false;
  if (!read_small_file(base + "/cmdline", cmdline)) return false;
  std::vector<std::string> args;
  for (size_t b = 0; b < cmdline.size();) {
    size_t e = cmdline.find('\0', b);
    if (e == std::string::npos) e = cmdline.size();
    args.push_back(cmdline.substr(b, e - b));
    b = e + 1;
  }
  for (size_t i = 1; i < args.size(); ++i)
    if ((args[i] == "--job" && i + 1 < args.size() && args[i + 1] == key) ||
        args[i] == "--job=" + key)
      return true;
  return false;
}

// Waits until every process in `fds` (pidfds) has exited or the time is up;
// returns the pidfds of those still running.
std::vector<int> wait_exit(std::vector<int> fds, int64_t timeout_ms) {
  int64_t deadline = now_ms() + timeout_ms;
  while (!fds.empty()) {
    std::vector<pollfd> p;
    for (int fd : fds) p.push_back({fd, POLLIN, 0});
    int64_t left = deadline - now_ms();
    if (left <= 0) break;
    int n = poll(p.data(), p.size(), int(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    std::vector<int> still;
    for (const pollfd& q : p) {
      if (q.revents)
        close(q.fd);
      else
        still.push_back(q.fd);
    }
    fds = std::move(still);
  }
  return fds;
}

}  // namespace

User lookup_user(uid_t uid, gid_t gid, std::vector<gid_t> groups) {
  User u{.uid = uid, .gid = gid};
  std::vector<char> buf(1 << 16);
  passwd pw, *found = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || !found)
    throw std::runtime_error("uid " + std::to_string(uid) + " is not in the password database");
  u.name = pw.pw_name;
  u.home = pw.pw_dir ? pw.pw_dir : "/";
  if (groups.empty()) {
    int n = 64;
    groups.resize(size_t(n));
    while (getgrouplist(u.name.c_str(), gid, groups.data(), &n) < 0) groups.resize(size_t(n) + 16);
    groups.resize(size_t(n));
  }
  bool has_primary = false;
  for (gid_t g : groups) has_primary |= g == gid;
  if (!has_primary) groups.push_back(gid);
  u.groups = std::move(groups);
  return u;
}

std::vector<std::string> user_environment(const User& user) {
  return {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + user.home, "USER=" + user.name,
          "LOGNAME=" + user.name};
}

StagerStart start_stager(const StagerLaunch& launch) {
  bool wait = launch.timeout_s > 0;
  std::vector<std::string> argv{launch.program};
  argv.insert(argv.end(), launch.args.begin(), launch.args.end());
  if (wait) argv.insert(argv.end(), {"--ready-fd", "3"});
  CArray args(argv), env(launch.env);
  const User& user = launch.user;
  const char* lock_path = launch.lock_path.c_str();

  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0)
    return {StagerState::kFailed, std::string("cannot make a pipe: ") + std::strerror(errno)};
  pid_t child = fork();
  if (child == 0) {
    close(p[0]);
    reset_signals();
    setsid();
    int w = fcntl(p[1], F_DUPFD_CLOEXEC, 10);
    if (w < 0 || !become(user)) {
      child_say(p[1], "error: cannot switch to the job's user\n");
      _exit(126);
    }
    if (chdir("/") != 0) _exit(126);
    // Checked as the user: a stager of this job holds this lock while it runs.
    int lock = open(lock_path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (lock >= 0) {
      if (flock(lock, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
        child_say(w, "running\n");
        _exit(0);
      }
      close(lock);
    }
    pid_t stager = fork();
    if (stager < 0) {
      child_say(w, "error: cannot fork the stager\n");
      _exit(126);
    }
    if (stager > 0) {  // the stager is nobody's child: it outlives the step
      child_say_pid(w, stager);
      _exit(0);
    }
    if (!stdio_to(-1) || (wait && dup2(w, 3) != 3)) _exit(127);
    close_range(wait ? 4 : 3, ~0U, 0);
    execve(args.get()[0], args.get(), env.get());
    child_say(wait ? 3 : -1, "error: cannot execute the stager\n");
    _exit(127);
  }
  close(p[1]);
  if (child < 0) {
    close(p[0]);
    return {StagerState::kFailed, std::string("cannot fork: ") + std::strerror(errno)};
  }
  int status;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }

  // Lines from the intermediate child ("pid N", "running", "error: ...") and
  // from the stager ("ready", "running", "error: ..."), in any order.
  std::string buffer;
  pid_t stager_pid = -1;
  int64_t deadline = now_ms() + int64_t(launch.timeout_s) * 1000;
  StagerStart result{StagerState::kTimeout, ""};
  bool done = false, eof = false;
  while (!done && !eof) {
    int64_t left = deadline - now_ms();
    pollfd pf{p[0], POLLIN, 0};
    int n = wait ? poll(&pf, 1, int(std::max<int64_t>(left, 0))) : 1;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // timeout
    char buf[512];
    ssize_t got = read(p[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) eof = true;
    if (got > 0) buffer.append(buf, size_t(got));
    size_t nl;
    while (!done && (nl = buffer.find('\n')) != std::string::npos) {
      std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      if (line.starts_with("pid ")) {
        stager_pid = pid_t(std::atoi(line.c_str() + 4));
        if (!wait) result = {StagerState::kStarted, ""}, done = true;
      } else if (line == "ready") {
        result = {StagerState::kReady, ""}, done = true;
      } else if (line == "running") {
        result = {StagerState::kRunning, ""}, done = true;
      } else if (line.starts_with("error: ")) {
        result = {StagerState::kFailed, line.substr(7)}, done = true;
      }
    }
  }
  close(p[0]);
  if (done) return result;
  if (eof)
    return {StagerState::kFailed,
            "the stager exited at start-up without an answer (see its stager.log)"};
  // No answer in time: kill the stager this call started, after checking
  // through a pidfd that it is the user's stager. SIGKILL, not SIGTERM: a
  // stager stuck (stopped, or waiting on a dead file system) would keep a
  // SIGTERM pending and its lock held, and no later step could start one.
  if (stager_pid > 0) {
    int fd = pidfd_open(stager_pid, 0);
    if (fd >= 0) {
      std::string key;
      for (size_t i = 0; i + 1 < argv.size(); ++i)
        if (argv[i] == "--job") key = argv[i + 1];
      if (is_job_stager(stager_pid, launch.program, user.uid, key))
        pidfd_send_signal(fd, SIGKILL, nullptr, 0);
      close(fd);
    }
  }
  return {StagerState::kTimeout, "the stager did not answer within " +
                                     std::to_string(launch.timeout_s) +
                                     " s (start_timeout in the configuration)"};
}

int stop_stagers(const std::string& program, uid_t uid, const std::string& key,
                 unsigned timeout_s) {
  std::vector<int> signalled;
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      long pid = std::strtol(e->d_name, &end, 10);
      if (*end || pid <= 1) continue;
      if (!is_job_stager(pid_t(pid), program, uid, key)) continue;
      int fd = pidfd_open(pid_t(pid), 0);
      if (fd < 0) continue;
      // The pidfd names one process for good: check that one again.
      if (is_job_stager(pid_t(pid), program, uid, key) &&
          pidfd_send_signal(fd, SIGTERM, nullptr, 0) == 0)
        signalled.push_back(fd);
      else
        close(fd);
    }
    closedir(d);
  }
  int found = int(signalled.size());
  std::vector<int> left = wait_exit(signalled, int64_t(timeout_s) * 1000);
  for (int fd : left) pidfd_send_signal(fd, SIGKILL, nullptr, 0);
  for (int fd : wait_exit(left, 5000)) close(fd);
  return found;
}

int run_as_user(const User& user, const std::vector<std::string>& argv,
                const std::vector<std::string>& env, unsigned timeout_s, std::string& output) {
  CArray args(argv), envp(env);
  output.clear();
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    reset_signals();
    setsid();
    int w = fcntl(p[1], F_DUPFD_CLOEXEC, 10);
    if (w < 0 || !become(user)) {
      child_say(p[1], "cannot switch to the job's user\n");
      _exit(126);
    }
    if (chdir("/") != 0 || !stdio_to(w)) _exit(126);
    close_range(3, ~0U, 0);
    execve(args.get()[0], args.get(), envp.get());
    child_say(2, "cannot execute the program\n");
    _exit(127);
  }
  close(p[1]);
  if (pid < 0) {
    close(p[0]);
    return -1;
  }
  int64_t deadline = now_ms() + int64_t(timeout_s) * 1000;
  bool killed = false;
  for (;;) {
    int64_t left = deadline - now_ms();
    pollfd pf{p[0], POLLIN, 0};
    int n = poll(&pf, 1, int(std::max<int64_t>(left, 0)));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {  // our own child, not reaped yet: its pid is still its own
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    char buf[1024];
    ssize_t got = read(p[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    if (output.size() < 4096) output.append(buf, size_t(got));
  }
  close(p[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (killed || WIFSIGNALED(status)) return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace monarch::spank
