#include "trash.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <vector>

#include "fd.h"

#ifndef MONARCH_PURGE
#define MONARCH_PURGE "/usr/local/libexec/monarch/monarch-purge"
#endif

namespace monarch {
namespace {

constexpr size_t kMaxHandOver = 64;

bool dot(const char* n) {
  return n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0));
}

// Empties `name`, a regular file at the trash's top with no other name,
// before it is unlinked: its blocks come back now even while something
// still holds it open (the loop device of a job's image that a process
// outside the job keeps mounted through a descriptor or its cwd).
void empty_file(int trash_fd, const char* name) {
  Fd fd(openat(trash_fd, name, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st;
  if (fd && fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1)
    (void)!ftruncate(fd.get(), 0);
}

// One pass over the trash: every entry goes through the bounded remover.
// True when something was deleted.
bool purge_pass(int trash_fd, PurgeResult& out) {
  DIR* d = fdopendir(openat(trash_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d) return false;
  bool progress = false;
  uint64_t mounts = 0, errors = 0;
  while (dirent* e = readdir(d)) {
    if (dot(e->d_name)) continue;
    if (e->d_type == DT_REG || e->d_type == DT_UNKNOWN) empty_file(trash_fd, e->d_name);
    RemoveResult r = remove_tree_at(trash_fd, e->d_name);
    out.removed.removed += r.removed;
    mounts += r.mounts, errors += r.errors;
    if (r.errors && !out.removed.first_errno)
      out.removed.first_errno = r.first_errno, out.removed.first_path = e->d_name;
    if (r.removed && !r.mounts && !r.errors) out.entries++;
    progress |= r.removed > 0;
  }
  closedir(d);
  out.removed.mounts = mounts, out.removed.errors = errors;
  return progress;
}

}  // namespace

bool move_to_trash(int parent_fd, const std::string& name, int trash_fd) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    uint64_t nonce = 0;
    if (getrandom(&nonce, sizeof nonce, GRND_NONBLOCK) != sizeof nonce)
      nonce = (uint64_t(getpid()) << 32) ^ uint64_t(attempt) ^ uint64_t(time(nullptr));
    char suffix[24];
    std::snprintf(suffix, sizeof suffix, ".%016llx", static_cast<unsigned long long>(nonce));
    std::string to = name.substr(0, 200) + suffix;
    if (renameat2(parent_fd, name.c_str(), trash_fd, to.c_str(), RENAME_NOREPLACE) == 0)
      return true;
    if (errno != EEXIST) return false;
  }
  return false;
}

bool trash_has_entries(int trash_fd) {
  DIR* d = fdopendir(openat(trash_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d) return false;
  bool any = false;
  while (dirent* e = readdir(d))
    if (!dot(e->d_name)) {
      any = true;
      break;
    }
  closedir(d);
  return any;
}

PurgeResult purge_trash(int trash_fd) {
  PurgeResult out;
  // Rounds, each under the lock, while they delete something: a mover that
  // found the lock taken left its entry to this purge, and the next round
  // (after the unlock, so no entry can fall between two purges) takes it.
  // One more round after one that deleted nothing, if the trash is not empty
  // then: an entry may have come after the last pass, its mover's purge gone.
  for (int round = 0, idle = 0;; ++round) {
    if (flock(trash_fd, LOCK_EX | LOCK_NB) != 0) {
      out.busy = round == 0;
      return out;
    }
    bool any = false;
    while (purge_pass(trash_fd, out)) any = true;
    flock(trash_fd, LOCK_UN);
    idle = any ? 0 : idle + 1;
    if (idle > 1 || (idle == 1 && !trash_has_entries(trash_fd))) return out;
  }
}

bool start_purge(const std::string& trash_dir, const std::string& log,
                 const std::vector<int>& hand_over, std::string& error) {
  // Everything the children need is made before fork: they run
  // async-signal-safe calls only.
  std::string program = MONARCH_PURGE, log_flag = "--log";
  std::vector<char*> argv{program.data(), const_cast<char*>(trash_dir.c_str())};
  if (!log.empty()) argv.insert(argv.end(), {log_flag.data(), const_cast<char*>(log.c_str())});
  argv.push_back(nullptr);
  char path_env[] = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";
  char* envp[] = {path_env, nullptr};
  if (hand_over.size() > kMaxHandOver) {
    error = "too many descriptors to hand over";
    return false;
  }
  if (access(program.c_str(), X_OK) != 0) {
    error = program + ": " + std::strerror(errno) + " (is Monarch installed completely?)";
    return false;
  }
  pid_t child = fork();
  if (child < 0) {
    error = std::string("cannot fork: ") + std::strerror(errno);
    return false;
  }
  if (child == 0) {
    // The caller may block signals (slurmstepd does): the purge gets a
    // clean mask and default handlers, in a session of its own.
    struct sigaction sa = {};
    sa.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s)
      if (s != SIGKILL && s != SIGSTOP) sigaction(s, &sa, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    setsid();
    if (fork() != 0) _exit(0);  // the purge is nobody's child
    int null = open("/dev/null", O_RDWR);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0) _exit(127);
    // The handed-over descriptors out of the way, then at 3, 4, ...
    int moved[kMaxHandOver];
    for (size_t i = 0; i < hand_over.size(); ++i)
      if ((moved[i] = fcntl(hand_over[i], F_DUPFD_CLOEXEC, 3 + int(hand_over.size()))) < 0)
        _exit(127);
    for (size_t i = 0; i < hand_over.size(); ++i)
      if (dup2(moved[i], 3 + int(i)) < 0) _exit(127);
    close_range(3 + unsigned(hand_over.size()), ~0U, 0);
    if (chdir("/") != 0) _exit(127);
    execve(argv[0], argv.data(), envp);
    _exit(127);
  }
  int status;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return true;
}

void lowest_priority() {
  // ioprio_set(2) has no glibc wrapper.
  constexpr int kWhoProcess = 1, kClassBestEffort = 2, kLowest = 7, kClassShift = 13;
  (void)!nice(19);
  syscall(SYS_ioprio_set, kWhoProcess, 0, (kClassBestEffort << kClassShift) | kLowest);
}

}  // namespace monarch
