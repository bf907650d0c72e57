// slurmstepd (remote context), for every step of a job that asked for
// Monarch, on every node. init_post_opt runs as root before any task of the
// step exists: it makes the job's directory on each tier (private to the
// user), starts the stager as the user (or finds it running) and sets the
// tasks' environment. task_init runs in each task, as the user, just before
// exec: rank 0 of the step tells the user when Monarch is off.
#include <fcntl.h>
#include <stdio.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "config.h"
#include "plugin.h"
#include "process.h"
#include "remove_tree.h"

namespace monarch::spank {
namespace {

// Step ids of <slurm/slurm.h>, which is not worth including for three numbers.
constexpr uint32_t kExternStep = 0xfffffffc;       // SLURM_EXTERN_CONT
constexpr uint32_t kBatchStep = 0xfffffffb;        // SLURM_BATCH_SCRIPT
constexpr uint32_t kInteractiveStep = 0xfffffffa;  // SLURM_INTERACTIVE_STEP

std::string errno_text() {
  return std::strerror(errno);
}

// <tier>/monarch-<key>, a directory owned by the user with mode 0700. The
// tier itself belongs to the admin (root, 0755 or 1777): only root can make
// the directory there for the user. Anything in the way that is not the
// user's directory (a leftover, another user's, a symbolic link) is removed
// first, without following links or entering mounts. The new directory is
// made under a temporary name and renamed into place, so a concurrent step
// never sees it half made.
void make_job_dir(const TierConfig& tier, const std::string& key, const User& user) {
  std::string dir = job_dir(tier, key), name = "monarch-" + key;
  int parent = open(tier.path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent < 0)
    throw std::runtime_error("tier " + tier.name + ": cannot open " + tier.path + ": " +
                             errno_text() + " (the admin creates each tier directory)");
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{parent};
  for (int attempt = 0; attempt < 3; ++attempt) {
    struct stat st;
    if (fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISDIR(st.st_mode) && st.st_uid == user.uid) {
        if ((st.st_mode & 07777) != 0700) {
          int fd = openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
          bool ok = fd >= 0 && fchmod(fd, 0700) == 0;
          int e = errno;
          if (fd >= 0) close(fd);
          if (!ok)
            throw std::runtime_error("cannot make " + dir + " private: " + std::strerror(e));
        }
        return;
      }
      RemoveResult r = remove_tree_at(parent, name);
      log_info(dir + " was there and not the job user's (owner uid " + std::to_string(st.st_uid) +
               "): removed " + std::to_string(r.removed) + " entries, left " +
               std::to_string(r.mounts) + " mount points alone");
      continue;
    }
    if (errno != ENOENT) throw std::runtime_error("cannot check " + dir + ": " + errno_text());
    uint64_t nonce = 0;
    (void)!getrandom(&nonce, sizeof nonce, 0);
    std::string tmp = "." + name + "." + std::to_string(getpid()) + "." + std::to_string(nonce);
    if (mkdirat(parent, tmp.c_str(), 0700) != 0)
      throw std::runtime_error("cannot create a directory in " + tier.path + ": " + errno_text());
    int fd = openat(parent, tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    bool ok = fd >= 0 && fchown(fd, user.uid, user.gid) == 0 && fchmod(fd, 0700) == 0;
    int e = errno;
    if (fd >= 0) close(fd);
    if (ok && renameat2(parent, tmp.c_str(), parent, name.c_str(), RENAME_NOREPLACE) == 0) return;
    if (ok) e = errno;
    unlinkat(parent, tmp.c_str(), AT_REMOVEDIR);
    if (!ok || e != EEXIST)
      throw std::runtime_error("cannot create " + dir + ": " + std::strerror(e));
    // Another step made it meanwhile: check that one.
  }
  throw std::runtime_error(dir + " is in the way and could not be removed");
}

std::string get_env(spank_t sp, const char* name) {
  std::vector<char> buf(4096);
  for (;;) {
    spank_err_t rc = spank_getenv(sp, name, buf.data(), int(buf.size()));
    if (rc == ESPANK_SUCCESS) return buf.data();
    if (rc != ESPANK_NOSPACE || buf.size() > (1 << 20)) return "";
    buf.resize(buf.size() * 4);
  }
}

void set_env(spank_t sp, const char* name, const std::string& value) {
  spank_err_t rc = spank_setenv(sp, name, value.c_str(), 1);
  if (rc != ESPANK_SUCCESS)
    throw std::runtime_error(std::string("cannot set ") + name + ": " + spank_strerror(rc));
}

// LD_PRELOAD entries, separated by spaces or colons as ld.so accepts them.
std::vector<std::string> preload_entries(const std::string& value) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= value.size()) {
    size_t end = value.find_first_of(" :", at);
    if (end == std::string::npos) end = value.size();
    if (end > at) out.push_back(value.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

// The tasks' environment for Monarch: the library appended to the user's
// LD_PRELOAD (a nested step inherits it: appended once), the dataset as
// given, the job directory on the first tier.
void set_task_env(spank_t sp, const Config& config, const std::string& key, const Request& r) {
  std::string preload = get_env(sp, "LD_PRELOAD");
  bool present = false;
  for (const std::string& e : preload_entries(preload)) present |= e == MONARCH_INTERPOSE_LIB;
  if (!present) set_env(sp, "LD_PRELOAD", preload.empty() ? MONARCH_INTERPOSE_LIB
                                                          : preload + ":" MONARCH_INTERPOSE_LIB);
  set_env(sp, "MONARCH_DATASET", r.dataset);
  set_env(sp, "MONARCH_JOB_DIR", job_dir(config.tiers.at(0), key));
  if (r.verbose) set_env(sp, "MONARCH_LOG", "1");
}

// A step without Monarch: takes back what an earlier step's environment may
// have passed down (a nested srun inherits the batch step's).
void clear_task_env(spank_t sp) {
  std::string preload = get_env(sp, "LD_PRELOAD"), kept;
  bool present = false;
  for (const std::string& e : preload_entries(preload)) {
    if (e == MONARCH_INTERPOSE_LIB) {
      present = true;
      continue;
    }
    kept += (kept.empty() ? "" : ":") + e;
  }
  if (present) {
    if (kept.empty())
      spank_unsetenv(sp, "LD_PRELOAD");
    else
      spank_setenv(sp, "LD_PRELOAD", kept.c_str(), 1);
  }
  spank_unsetenv(sp, "MONARCH_DATASET");
  spank_unsetenv(sp, "MONARCH_JOB_DIR");
}

std::string step_name(uint32_t step) {
  if (step == kBatchStep) return "batch";
  if (step == kInteractiveStep) return "interactive";
  return std::to_string(step);
}

template <class T>
T item(spank_t sp, spank_item_t what, const char* name) {
  T value{};
  spank_err_t rc = spank_get_item(sp, what, &value);
  if (rc != ESPANK_SUCCESS)
    throw std::runtime_error(std::string("cannot get ") + name + ": " + spank_strerror(rc));
  return value;
}

// Monarch for this step; throws with the reason it cannot be.
void start_step(spank_t sp, const std::string& key) {
  const State& s = state();
  auto uid = item<uid_t>(sp, S_JOB_UID, "the job's uid");
  auto gid = item<gid_t>(sp, S_JOB_GID, "the job's gid");
  if (uid == 0) throw std::runtime_error("jobs of root do not use Monarch");
  gid_t* gids = nullptr;
  int ngids = 0;
  std::vector<gid_t> groups;
  if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &ngids) == ESPANK_SUCCESS && gids)
    groups.assign(gids, gids + ngids);
  User user = lookup_user(uid, gid, groups);

  Config config;
  try {
    config = load_config(s.args.config);
  } catch (const ConfigError& e) {
    throw std::runtime_error(std::string("node configuration: ") + e.what());
  }
  for (const TierConfig& tier : config.tiers) make_job_dir(tier, key, user);

  StagerLaunch launch{
      .program = MONARCH_STAGER,
      .args = {"--dataset", s.request.dataset, "--job", key, "--config", s.args.config},
      .env = user_environment(user),
      .lock_path = job_dir(config.tiers[0], key) + "/stager.lock",
      .timeout_s = config.start_timeout_s,
      .user = user};
  launch.env.push_back("SLURM_JOB_ID=" + key.substr(3));
  StagerStart started = start_stager(launch);
  if (started.state == StagerState::kFailed || started.state == StagerState::kTimeout)
    throw std::runtime_error(started.message);
  set_task_env(sp, config, key, s.request);
}

}  // namespace

int remote_init_post_opt(spank_t sp) {
  State& s = state();
  if (!s.args.enabled || !s.request.dataset_given) return 0;
  auto job = item<uint32_t>(sp, S_JOB_ID, "the job id");
  auto step = item<uint32_t>(sp, S_JOB_STEPID, "the step id");
  if (step == kExternStep) return 0;  // no tasks there
  std::string key = "job" + std::to_string(job);
  try {
    start_step(sp, key);
  } catch (const std::exception& e) {
    s.disabled = e.what();
  }
  if (!s.disabled.empty()) {
    log_error("job " + std::to_string(job) + " step " + step_name(step) +
              ": disabled: " + s.disabled);
    clear_task_env(sp);
  }
  return 0;
}

int remote_task_init(spank_t sp) {
  const State& s = state();
  if (s.disabled.empty()) return 0;
  uint32_t rank = 1;
  if (spank_get_item(sp, S_TASK_GLOBAL_ID, &rank) != ESPANK_SUCCESS || rank != 0) return 0;
  std::string line = "monarch: disabled for this job: " + s.disabled + "; reading from the PFS\n";
  (void)!write(STDERR_FILENO, line.data(), line.size());
  return 0;
}

}  // namespace monarch::spank
