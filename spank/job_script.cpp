// job_epilog: a fresh process that slurmd runs as root on every node of the
// job when it ends (normally, by scancel, at the time limit, after a stager
// crash). It never fails: a failing or slow epilog drains the node, and
// everything here can be disturbed by the user. Its cost does not grow
// with what the job built, and it waits on nothing the user controls
// without a deadline. As named steps:
//   find_records     what Monarch made for the job: its root-owned records
//                    (none, and no --monarch-dataset: nothing is touched)
//   stop_stager      the job's stagers, by pidfd (SIGTERM, then SIGKILL)
//   write_report     monarch-report as the user, in the job's cgroup, with
//                    the job's groups and umask (from the record), bounded
//                    in time, memory and input
//   end_cgroups      whatever is left in the job's Monarch cgroups, killed
//   release_spaces   every mount detached, the job's directory (or image)
//                    moved to the trash: one rename each
//   sweep, purge     other jobs' leftovers; the trash deleted in the
//                    background by monarch-purge
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "cgroup.h"
#include "job_space.h"
#include "jobmap.h"
#include "mounts.h"
#include "plugin.h"
#include "proc.h"
#include "sweep.h"
#include "tier.h"

namespace monarch::spank {
namespace {

// monarch-report at the job's end: its deadline and limits, above what a
// statistics file within monarch-report's own input bound needs (16 MiB:
// 1.0 GiB and 6 s, report.h).
constexpr unsigned kReportTimeout = 20;
constexpr rlim_t kReportMemory = rlim_t(2) << 30;
constexpr rlim_t kReportFileSize = rlim_t(256) << 20;
constexpr rlim_t kReportFiles = 64;

struct JobEnd {
  uint32_t job = 0;
  uid_t uid = 0;
  std::string key;
  Config config;
  std::optional<JobRecord> record;  // on the first tier: the job's identity for its report
  bool any_record = false;          // on any tier
  std::vector<std::string> cgroups;
  std::vector<Fd> images;  // released images, still held, for the purge to let go
  std::vector<Fd> held;    // the job's records, held until its spaces are released
};

// Where the report goes: --monarch-report, else the site's report_dir, else
// the job's working directory (slurmd gives it to the epilog as
// SLURM_JOB_WORK_DIR), else nowhere.
std::string report_dir(const Config& config) {
  if (!state().request.report.empty()) return state().request.report;
  if (!config.report_dir.empty()) return config.report_dir;
  const char* work = std::getenv("SLURM_JOB_WORK_DIR");
  return work && work[0] == '/' ? work : "";
}

// Reads the job's records (root's own files, in directories only root can
// reach); nothing in the tiers is looked at.
void find_records(JobEnd& end) {
  for (size_t i = 0; i < end.config.tiers.size(); ++i) {
    try {
      Tier tier = open_tier(end.config.tiers[i], /*create=*/false);
      if (!tier.has_state()) continue;
      std::optional<JobRecord> r = read_record(tier.jobs.get(), end.key);
      end.any_record |= bool(r);
      if (r) end.held.push_back(hold_record(tier.jobs.get(), end.key));
      if (i == 0 && r) {
        end.record = r;
        end.cgroups = read_cgroup_record(tier.jobs.get(), end.key);
      }
    } catch (const TierError& e) {
      log_error(end.key + ": " + e.what());
    }
  }
}

void stop_stager(const JobEnd& end) {
  int stopped = stop_stagers(MONARCH_STAGER, end.uid, end.key, end.config.stop_timeout_s);
  if (stopped) log_info(end.key + ": stopped " + std::to_string(stopped) + " stager(s)");
}

// As the user, never root, from the record's identity (no password or group
// database now). monarch-report bounds what it reads; a statistics file
// above that bound gets one line in <dir>/monarch-<key>.txt instead.
void run_report(const JobEnd& end) {
  const JobRecord& r = *end.record;
  if (r.damaged) {
    log_error(end.key + ": no report: its record is damaged, so there is no identity to write as");
    return;
  }
  // A record of another run (made before a reboot, or for another user's job
  // of the same id) names somebody else: nobody is written as.
  if (r.uid != end.uid || r.boot != boot_id()) {
    log_error(end.key + ": no report: its record is of another run of this job id");
    return;
  }
  std::string dir = report_dir(end.config);
  std::string stats = job_dir(end.config.tiers[0], end.key) + "/" + kStatsName;
  if (dir.empty()) {
    log_error(end.key + ": no report: no --monarch-report, report_dir or job working directory");
    return;
  }
  if (access(MONARCH_REPORT, X_OK) != 0) {
    log_error(end.key + ": no report: " + MONARCH_REPORT + " is not installed");
    return;
  }
  // The statistics are read through the job's directory: not when the job
  // covered it with a mount of its own (a FUSE daemon may never answer).
  Tier tier = open_tier(end.config.tiers[0], /*create=*/false);
  uint64_t top = mount_id_at(tier.root.get(), space_name(end.key).c_str());
  if (top != r.mount_id) {
    log_error(end.key + ": no report: the job mounted something on its directory " +
              tier.root_path + "/" + space_name(end.key));
    return;
  }
  User user{.uid = r.uid, .gid = r.gid, .groups = r.groups, .home = "/"};
  ChildSetup setup{.user = &user,
                   .limits = {{RLIMIT_AS, kReportMemory, kReportMemory},
                              {RLIMIT_CPU, kReportTimeout, kReportTimeout},
                              {RLIMIT_FSIZE, kReportFileSize, kReportFileSize},
                              {RLIMIT_NOFILE, kReportFiles, kReportFiles},
                              {RLIMIT_CORE, 0, 0}},
                   .umask = r.umask};
  for (const std::string& leaf : end.cgroups) setup.cgroups.push_back({.dir = leaf});
  std::vector<std::string> argv{MONARCH_REPORT, "--write", dir, stats, "--job", end.key};
  std::string output;
  int rc = run_process(setup, argv, user_environment(user), kReportTimeout, output);
  while (!output.empty() && output.back() == '\n') output.pop_back();
  if (rc == 0)
    log_info(end.key + ": report written to " + dir);
  else
    log_error(end.key + ": the report to " + dir + " failed (exit " + std::to_string(rc) +
              "): " + output);
}

void write_report(const JobEnd& end) {
  if (!end.record) return;  // Monarch never started for the job on this node
  try {
    run_report(end);
  } catch (const std::exception& e) {
    log_error(end.key + ": no report: " + e.what());
  }
}

void end_cgroups(const JobEnd& end) {
  RemovedCgroups removed = remove_job_cgroups(end.cgroups, kCgroupTimeout);
  if (removed.memory_peak)
    log_info(end.key + ": the job's Monarch cgroup (stager, report) used at most " +
             std::to_string((*removed.memory_peak + (1 << 20) - 1) >> 20) + " MiB of memory");
  if (removed.killed)
    log_info(end.key + ": killed " + std::to_string(removed.killed) +
             " process(es) left in the job's Monarch cgroup");
  for (const std::string& leaf : removed.left)
    log_error(end.key + ": " + left_leaf_text(leaf, kCgroupTimeout));
}

void release_spaces(JobEnd& end) {
  for (const TierConfig& tc : end.config.tiers) {
    try {
      Tier tier = open_tier(tc, /*create=*/false);
      if (!tier.has_state()) continue;
      TierLock lock(tier, end.config.start_timeout_s + 10);
      std::optional<JobRecord> r = read_record(tier.jobs.get(), end.key);
      if (!r) continue;
      Release done = release_space(tier, *r);
      if (done.image) end.images.push_back(std::move(done.image));
      if (!done.problem.empty())
        log_error(end.key + ": tier " + tc.name + ": " + done.problem +
                  "; left for the next sweep");
      else if (done.mounts > 0)
        log_info(end.key + ": tier " + tc.name + ": detached " + std::to_string(done.mounts) +
                 " mount(s) the job left");
    } catch (const std::exception& e) {
      log_error(end.key + ": tier " + tc.name + ": " + e.what() + "; left for the next sweep");
    }
  }
}

double seconds_since(const timespec& start) {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return double(now.tv_sec - start.tv_sec) + double(now.tv_nsec - start.tv_nsec) / 1e9;
}

}  // namespace

int job_epilog(spank_t sp) {
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  State& s = state();
  if (!s.args.enabled) return 0;
  job_script_getopt(sp);
  JobEnd end;
  if (spank_get_item(sp, S_JOB_ID, &end.job) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_UID, &end.uid) != ESPANK_SUCCESS) {
    log_error("job_epilog: no job id or user; nothing cleaned");
    return 0;
  }
  end.key = "job" + std::to_string(end.job);
  try {
    end.config = load_config(s.args.config);
  } catch (const ConfigError& e) {
    if (s.request.dataset_given)
      log_error(end.key + ": node configuration: " + e.what() + "; cannot clean the tiers");
    return 0;
  }
  find_records(end);
  if (!end.any_record && !s.request.dataset_given) return 0;  // Monarch was not used

  if (end.uid != 0) stop_stager(end);  // root's jobs never have one
  write_report(end);
  end_cgroups(end);
  release_spaces(end);
  end.held.clear();
  sweep(end.config, end.key, end.images);
  purge_tiers(end.config, end.images);
  char took[32];
  std::snprintf(took, sizeof took, "%.3f", seconds_since(start));
  log_info(end.key + ": epilog done in " + took + " s");
  return 0;
}

}  // namespace monarch::spank
