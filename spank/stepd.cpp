// slurmstepd (remote context), for every step of a job that asked for
// Monarch, on every node. A step's start, as named steps:
//   init_post_opt (root, before the job's cgroups exist for its first step):
//     plan_step      who the job runs as (ids, groups, umask, limits, from
//                    Slurm), the node's configuration, the job's record
//     prepare_tiers  the job's space on every tier (job_space.h): made by
//                    the first step on the node, checked by the others
//   user_init (slurmstepd with the user's euid, after Slurm made the job's
//   cgroups, before any task exists):
//     start_stager_for  the stager, in the job's Monarch cgroup (cgroup.h),
//                       or the one already running
//     set_task_env      the library appended to the tasks' LD_PRELOAD, Monarch's
//                       variables, and the same for Apptainer (task_env.h)
// Any failure turns Monarch off for the step with one log line; task_init
// then tells the user on rank 0's stderr, and the step runs from the PFS.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "cgroup.h"
#include "hostlist.h"
#include "job_key.h"
#include "job_space.h"
#include "jobmap.h"
#include "plugin.h"
#include "proc.h"
#include "shown.h"
#include "task_env.h"
#include "tier.h"

namespace monarch::spank {
namespace {

// Step ids of <slurm/slurm.h>, which is not worth including for three numbers.
constexpr uint32_t kExternStep = 0xfffffffc;       // SLURM_EXTERN_CONT
constexpr uint32_t kBatchStep = 0xfffffffb;        // SLURM_BATCH_SCRIPT
constexpr uint32_t kInteractiveStep = 0xfffffffa;  // SLURM_INTERACTIVE_STEP
constexpr mode_t kDefaultUmask = 022;              // Slurm's when the job carries none

// The limits slurmstepd propagates to tasks (PropagateResourceLimits) as
// SLURM_RLIMIT_<NAME>: the stager gets the same soft limits.
constexpr std::pair<const char*, int> kLimits[] = {
    {"CPU", RLIMIT_CPU},     {"FSIZE", RLIMIT_FSIZE},   {"DATA", RLIMIT_DATA},
    {"STACK", RLIMIT_STACK}, {"CORE", RLIMIT_CORE},     {"RSS", RLIMIT_RSS},
    {"NPROC", RLIMIT_NPROC}, {"NOFILE", RLIMIT_NOFILE}, {"MEMLOCK", RLIMIT_MEMLOCK},
    {"AS", RLIMIT_AS}};

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

template <class T>
T item(spank_t sp, spank_item_t what, const char* name) {
  T value{};
  spank_err_t rc = spank_get_item(sp, what, &value);
  if (rc != ESPANK_SUCCESS)
    throw std::runtime_error(std::string("cannot get ") + name + ": " + spank_strerror(rc));
  return value;
}

std::string step_name(uint32_t step) {
  if (step == kBatchStep) return "batch";
  if (step == kInteractiveStep) return "interactive";
  return std::to_string(step);
}

// Not empty, and no control character (a newline, an escape).
bool printable(const std::string& s) {
  return !s.empty() && std::none_of(s.begin(), s.end(), is_control);
}

// ---- plan_step ----

// Who the job runs as, from Slurm alone: ids and groups as the job has
// them, its name and home from the job's environment (they only make the
// environment of the stager, and never the record). No password or group
// lookup.
User job_user(spank_t sp) {
  User u{.uid = item<uid_t>(sp, S_JOB_UID, "the job's uid"),
         .gid = item<gid_t>(sp, S_JOB_GID, "the job's gid")};
  if (u.uid == 0) throw std::runtime_error("jobs of root do not use Monarch");
  gid_t* gids = nullptr;
  int ngids = 0;
  if (spank_get_item(sp, S_JOB_SUPPLEMENTARY_GIDS, &gids, &ngids) == ESPANK_SUCCESS && gids)
    u.groups.assign(gids, gids + ngids);
  if (std::find(u.groups.begin(), u.groups.end(), u.gid) == u.groups.end())
    u.groups.push_back(u.gid);
  // USER and HOME only make the stager's environment (it runs as the user);
  // still, nothing with a control character in it is passed on.
  u.name = get_env(sp, "SLURM_JOB_USER");
  if (u.name.empty()) u.name = get_env(sp, "USER");
  if (!printable(u.name)) u.name = "uid" + std::to_string(u.uid);
  u.home = get_env(sp, "HOME");
  if (u.home[0] != '/' || !printable(u.home)) u.home = "/";
  return u;
}

// The job's umask (SLURM_UMASK, which sbatch and srun set from the user's).
mode_t job_umask(spank_t sp) {
  std::string v = get_env(sp, "SLURM_UMASK");
  char* end = nullptr;
  unsigned long mask = std::strtoul(v.c_str(), &end, 8);
  return v.empty() || *end ? kDefaultUmask : mode_t(mask & 0777);
}

// The soft limits the job's tasks get, at most slurmstepd's hard ones.
std::vector<Limit> job_limits(spank_t sp) {
  std::vector<Limit> limits;
  for (const auto& [name, resource] : kLimits) {
    std::string v = get_env(sp, (std::string("SLURM_RLIMIT_") + name).c_str());
    if (!v.empty() && v[0] == 'U') v.erase(0, 1);  // asked for with --propagate
    char* end = nullptr;
    errno = 0;
    unsigned long long value = std::strtoull(v.c_str(), &end, 10);
    struct rlimit now;
    if (v.empty() || *end || errno || getrlimit(resource, &now) != 0) continue;
    limits.push_back({resource, std::min<rlim_t>(rlim_t(value), now.rlim_max), now.rlim_max});
  }
  return limits;
}

// How many times Slurm restarted the job (a requeue makes a new run).
uint32_t restart_count(spank_t sp) {
  uint32_t n = 0;
  return spank_get_item(sp, S_SLURM_RESTART_COUNT, &n) == ESPANK_SUCCESS ? n : 0;
}

Config node_config() {
  try {
    return load_config(state().args.config);
  } catch (const ConfigError& e) {
    throw std::runtime_error(std::string("node configuration: ") + e.what());
  }
}

StepPlan plan_step(spank_t sp, uint32_t job) {
  const State& s = state();
  StepPlan plan{.job = job, .key = "job" + std::to_string(job)};
  plan.user = job_user(sp);
  plan.config = node_config();
  const User& u = plan.user;
  plan.record = {.key = plan.key,
                 .space = plan.config.job_space,
                 .uid = u.uid,
                 .gid = u.gid,
                 .groups = u.groups,
                 .umask = job_umask(sp),
                 .boot = boot_id(),
                 .restarts = restart_count(sp)};
  plan.launch = {.program = MONARCH_STAGER,
                 .key = plan.key,
                 .args = {"--dataset", s.request.dataset, "--config", s.args.config},
                 .env = user_environment(u),
                 .lock_path = job_dir(plan.config.tiers.at(0), plan.key) + "/" + kLockName,
                 .timeout_s = plan.config.start_timeout_s,
                 .setup = {.limits = job_limits(sp), .umask = plan.record.umask}};
  plan.launch.env.push_back("SLURM_JOB_ID=" + std::to_string(job));
  // A multi-node job: its nodes, this node's name, port and key, for one
  // cache (jobwide.h). The name is Slurm's NodeName, which may differ from
  // the host name: the step's node list at the node's id in the step, which
  // slurmstepd holds. (At this point the step's SLURMD_NODENAME is still the
  // one a nested srun inherited from the batch step's node.) The batch and
  // interactive steps run on the job's first node, id 0, and their
  // environment may hold an enclosing job's step list. No name: the stager
  // takes its short host name.
  std::string nodes = get_env(sp, "SLURM_JOB_NODELIST");
  if (plan.config.job_wide && nodes.find_first_of(",[") != std::string::npos) {
    try {
      JobKey key = derive_job_key(plan.config, job, u.uid, plan.record.restarts);
      plan.launch.secret = std::move(key.secret);
      plan.launch.args.insert(plan.launch.args.end(), {"--nodes", nodes});
      uint32_t step = 0, nodeid = 0;
      std::string name;
      if (spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS) {
      } else if (step == kBatchStep || step == kInteractiveStep) {
        name = node_name(nodes, 0);
      } else if (spank_get_item(sp, S_JOB_NODEID, &nodeid) == ESPANK_SUCCESS) {
        name = node_name(get_env(sp, "SLURM_STEP_NODELIST"), nodeid);
      }
      if (!name.empty()) plan.launch.args.insert(plan.launch.args.end(), {"--node", name});
    } catch (const JobKeyError& e) {
      log_error("job " + std::to_string(job) + ": " + e.what());
    }
  }
  return plan;
}

// ---- prepare_tiers ----

void prepare_tiers(const StepPlan& plan) {
  for (const TierConfig& tc : plan.config.tiers) {
    Tier tier = open_tier(tc, /*create=*/true);
    TierLock lock(tier, plan.config.start_timeout_s + 10);
    prepare_space(tier, plan.record, plan.user);
    state().held.push_back(hold_record(tier.jobs.get(), plan.key));  // under the tier's lock
  }
}

// ---- start_stager_for ----

void start_stager_for(StepPlan& plan) {
  StagerLaunch& launch = plan.launch;
  launch.setup.user = &plan.user;
  launch.setup.cgroups = job_cgroup_leaves(plan.job);
  std::string tier0 = plan.config.tiers[0].path;
  while (tier0.size() > 1 && tier0.back() == '/') tier0.pop_back();
  launch.setup.cgroup_record = tier0 + "/.monarch/jobs/" + cgroup_record_name(plan.key);
  StagerStart started = start_stager(launch);
  if (started.state == StagerState::kFailed || started.state == StagerState::kTimeout)
    throw std::runtime_error(started.message);
}

// ---- set_task_env ----

// A variable of the tasks' environment, or nullopt when it is not set.
std::optional<std::string> lookup(spank_t sp, const std::string& name) {
  char probe[1];
  spank_err_t rc = spank_getenv(sp, name.c_str(), probe, sizeof probe);
  if (rc != ESPANK_SUCCESS && rc != ESPANK_NOSPACE) return std::nullopt;
  return get_env(sp, name.c_str());
}

// The tasks' environment for Monarch (task_env.h): the library appended to
// the user's LD_PRELOAD (a nested step inherits it: appended once), the
// dataset as given, the job directory of every tier, and the same for
// Apptainer/Singularity.
void set_task_env(spank_t sp, const StepPlan& plan) {
  TaskEnv task{.library = MONARCH_INTERPOSE_LIB,
               .dataset = state().request.dataset,
               .log = state().request.verbose};
  for (const TierConfig& tc : plan.config.tiers) task.job_dirs.push_back(job_dir(tc, plan.key));
  std::vector<EnvChange> changes;
  try {
    changes = monarch_task_env(task, [sp](const std::string& n) { return lookup(sp, n); });
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  for (const EnvChange& c : changes) set_env(sp, c.name.c_str(), *c.value);
}

// A step without Monarch: takes back what an earlier step's environment may
// have passed down (a nested srun inherits the batch step's).
void clear_task_env(spank_t sp) {
  auto env = [sp](const std::string& n) { return lookup(sp, n); };
  for (const EnvChange& c : monarch_clear_env(MONARCH_INTERPOSE_LIB, env)) {
    if (c.value)
      spank_setenv(sp, c.name.c_str(), c.value->c_str(), 1);
    else
      spank_unsetenv(sp, c.name.c_str());
  }
}

// Monarch off for this step: one log line, the environment taken back.
void disable(spank_t sp, uint32_t job, uint32_t step, const std::string& why) {
  State& s = state();
  s.disabled = why;
  s.plan.reset();
  log_error("job " + std::to_string(job) + " step " + step_name(step) + ": disabled: " + why);
  clear_task_env(sp);
}

}  // namespace

int remote_init_post_opt(spank_t sp) {
  State& s = state();
  if (!s.args.enabled || !s.request.dataset_given) return 0;
  auto job = item<uint32_t>(sp, S_JOB_ID, "the job id");
  auto step = item<uint32_t>(sp, S_JOB_STEPID, "the step id");
  if (step == kExternStep) return 0;  // no tasks there
  try {
    s.plan = plan_step(sp, job);
    prepare_tiers(*s.plan);
  } catch (const std::exception& e) {
    disable(sp, job, step, e.what());
  }
  return 0;
}

int remote_user_init(spank_t sp) {
  State& s = state();
  if (!s.plan) return 0;
  uint32_t step = 0;
  spank_get_item(sp, S_JOB_STEPID, &step);
  try {
    start_stager_for(*s.plan);
    set_task_env(sp, *s.plan);
  } catch (const std::exception& e) {
    disable(sp, s.plan->job, step, e.what());
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
