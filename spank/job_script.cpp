// job_epilog: a fresh process that slurmd runs as root on every node of the
// job when it ends (normally, by scancel, at the time limit, after a stager
// crash). Stops the job's stagers, renders the report as the user, deletes
// the job's directories on every tier. It never fails: a failing epilog
// drains the node, and everything here can be disturbed by the user.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "config.h"
#include "plugin.h"
#include "process.h"
#include "remove_tree.h"

namespace monarch::spank {
namespace {

constexpr unsigned kReportTimeout = 60;

// Where the report goes: --monarch-report, else the site's report_dir, else
// the job's working directory (slurmd gives it to the epilog as
// SLURM_JOB_WORK_DIR), else nowhere.
std::string report_dir(const Config& config) {
  if (!state().request.report.empty()) return state().request.report;
  if (!config.report_dir.empty()) return config.report_dir;
  const char* work = std::getenv("SLURM_JOB_WORK_DIR");
  return work && work[0] == '/' ? work : "";
}

// The statistics' copy when monarch-report is missing: monarch-<key>.json.
// The epilog of every node of a job writes into the same directory, so on a
// job of several nodes the name carries the node's.
std::string fallback_report_name(const std::string& key) {
  const char* nodes = std::getenv("SLURM_JOB_NODELIST");
  const char* node = std::getenv("SLURMD_NODENAME");
  bool several = nodes && (std::strchr(nodes, ',') || std::strchr(nodes, '['));
  if (several && node && *node && !std::strchr(node, '/'))
    return "monarch-" + key + "-" + node + ".json";
  return "monarch-" + key + ".json";
}

// As the user, never root: monarch-report when it is installed, else a copy
// of the statistics. A directory the user cannot write stays unwritten.
void write_report(const User& user, const std::string& key, const std::string& stats,
                  const std::string& dir) {
  std::vector<std::string> argv;
  if (access(MONARCH_REPORT, X_OK) == 0)
    argv = {MONARCH_REPORT, "--write", dir, stats};
  else
    argv = {"/bin/cp", "--", stats, dir + "/" + fallback_report_name(key)};
  std::string output;
  int rc = run_as_user(user, argv, user_environment(user), kReportTimeout, output);
  while (!output.empty() && output.back() == '\n') output.pop_back();
  if (rc != 0)
    log_error(key + ": the report to " + dir + " failed (" + argv[0] + " exit " +
              std::to_string(rc) + "): " + output);
  else
    log_info(key + ": report written to " + dir);
}

}  // namespace

int job_epilog(spank_t sp) {
  State& s = state();
  if (!s.args.enabled) return 0;
  job_script_getopt(sp);
  uint32_t job = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
    log_error("job_epilog: no job id or user; nothing cleaned");
    return 0;
  }
  std::string key = "job" + std::to_string(job);
  Config config;
  bool have_config = true;
  try {
    config = load_config(s.args.config);
  } catch (const ConfigError& e) {
    log_error(key + ": node configuration: " + e.what() + "; cannot clean the tiers");
    have_config = false;
  }

  // Stagers run as the user: root's jobs never have one.
  int stopped = uid == 0 ? 0
                         : stop_stagers(MONARCH_STAGER, uid, key,
                                        have_config ? config.stop_timeout_s : 10);
  if (stopped) log_info(key + ": stopped " + std::to_string(stopped) + " stager(s)");
  if (!have_config) return 0;

  std::string first = job_dir(config.tiers[0], key);
  struct stat st;
  if (uid != 0 && lstat(first.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == uid) {
    std::string dir = report_dir(config), stats = first + "/stats.json";
    if (lstat(stats.c_str(), &st) != 0)
      log_info(key + ": no report: the stager left no statistics");
    else if (dir.empty())
      log_error(key + ": no report: no --monarch-report, report_dir or job working directory");
    else
      try {
        write_report(lookup_user(uid, gid, {}), key, stats, dir);
      } catch (const std::exception& e) {
        log_error(key + ": no report: " + e.what());
      }
  }

  for (const TierConfig& tier : config.tiers) {
    std::string dir = job_dir(tier, key);
    RemoveResult r = remove_tree(dir);
    if (r.errors || r.mounts)
      log_error(key + ": removing " + dir + ": " + std::to_string(r.removed) + " removed, " +
                std::to_string(r.mounts) + " mount points left alone, " +
                std::to_string(r.errors) + " errors (first: " + r.first_path + ": " +
                std::strerror(r.first_errno) + ")");
  }
  return 0;
}

}  // namespace monarch::spank
