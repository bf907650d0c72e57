#include "tier.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace monarch::spank {
namespace {

constexpr const char* kStateDir = ".monarch";

std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", unsigned(mode & 07777));
  return buf;
}

// Opens (with `create`, makes) a directory of Monarch's state below
// `parent`, checked to be root's, private and on the tier's file system.
Fd open_state_dir(int parent, const char* name, const std::string& where, dev_t dev, bool create) {
  if (create && mkdirat(parent, name, 0700) != 0 && errno != EEXIST)
    throw TierError("cannot create " + where + ": " + std::strerror(errno));
  Fd fd(openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT && !create) return fd;
    throw TierError("cannot open " + where + ": " + std::strerror(errno) +
                    " (Monarch's state on the tier: a directory of root's, mode 0700)");
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || st.st_uid != 0 || (st.st_mode & 07777) != 0700 ||
      st.st_dev != dev)
    throw TierError(where + " is not Monarch's (owner uid " + std::to_string(st.st_uid) +
                    ", mode " + mode_text(st.st_mode) +
                    "): it must be a directory of root's, mode 0700, on the tier's file system; "
                    "remove it");
  return fd;
}

}  // namespace

std::string space_name(const std::string& key) {
  return "monarch-" + key;
}

Tier open_tier(const TierConfig& config, bool create) {
  Tier t;
  t.config = &config;
  std::string what = "tier " + config.name + " (" + config.path + ")";
  t.root = Fd(open(config.path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!t.root)
    throw TierError(what + ": cannot open it: " + std::strerror(errno) +
                    " (the admin creates each tier directory, root's, mode 0755)");
  struct stat st;
  if (fstat(t.root.get(), &st) != 0) throw TierError(what + ": " + std::strerror(errno));
  if (st.st_uid != 0 || (st.st_mode & 022)) {
    std::string why = st.st_uid != 0            ? "belongs to uid " + std::to_string(st.st_uid)
                      : (st.st_mode & 002) != 0 ? "is world-writable"
                                                : "is group-writable";
    throw TierError(what + " " + why + " (mode " + mode_text(st.st_mode) +
                    "): a Slurm job's tier must be a directory only root can write, so that "
                    "no user can make or replace a job's directory in it (chown root, "
                    "chmod 0755)");
  }
  char real[PATH_MAX];
  ssize_t n =
      readlink(("/proc/self/fd/" + std::to_string(t.root.get())).c_str(), real, sizeof real - 1);
  t.root_path = n > 0 ? std::string(real, size_t(n)) : config.path;
  std::string state = t.root_path + "/" + kStateDir;
  t.state = open_state_dir(t.root.get(), kStateDir, state, st.st_dev, create);
  if (!t.state) return t;
  t.jobs = open_state_dir(t.state.get(), "jobs", state + "/jobs", st.st_dev, create);
  t.images = open_state_dir(t.state.get(), "images", state + "/images", st.st_dev, create);
  t.trash = open_state_dir(t.state.get(), "trash", state + "/trash", st.st_dev, create);
  if (!t.jobs || !t.images || !t.trash)
    throw TierError(state +
                    " is incomplete: remove it (nothing of a running job is lost only "
                    "if no Monarch job runs on the node)");
  t.trash_path = state + "/trash";
  return t;
}

TierLock::TierLock(const Tier& tier, unsigned timeout_s) : fd_(tier.state.get()) {
  timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    if (flock(fd_, LOCK_EX | LOCK_NB) == 0) return;
    if (errno != EWOULDBLOCK && errno != EINTR)
      throw TierError("cannot lock " + tier.root_path + "/.monarch: " + std::strerror(errno));
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec >= time_t(timeout_s))
      throw TierError("another job held " + tier.root_path + "/.monarch for " +
                      std::to_string(timeout_s) + " s");
    timespec pause = {0, 20'000'000};
    nanosleep(&pause, nullptr);
  }
}

TierLock::~TierLock() {
  flock(fd_, LOCK_UN);
}

}  // namespace monarch::spank
