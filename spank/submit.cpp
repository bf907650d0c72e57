// The options, and their checks at submission: in sbatch/salloc (allocator
// context) and srun (local context), running as the submitting user, so a
// check of access() answers for that user. A refused option fails the
// submission with a message naming the path, the reason and what to do.
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "config.h"
#include "jobmap.h"
#include "plugin.h"

namespace monarch::spank {
namespace {

enum OptionId { kDataset = 1, kReport = 2, kVerbose = 3 };

// The reason a dataset directory cannot be used, or "" when it can.
std::string check_dataset(const std::string& path, const std::string& config_path) {
  if (path.empty()) return "empty path: give the dataset's directory";
  if (path[0] != '/')
    return "not an absolute path: give the full path, e.g. --monarch-dataset=$PWD/" + path;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR)
      return "no such directory: give the absolute path of an existing dataset directory";
    if (errno == EACCES)
      return "permission denied on a directory above it: you must be able to reach the dataset";
    return std::string(std::strerror(errno)) + ": the dataset must be a readable directory";
  }
  if (!S_ISDIR(st.st_mode)) return "not a directory: give the directory that holds the dataset";
  if (access(path.c_str(), R_OK | X_OK) != 0)
    return "you cannot read it (" + std::string(std::strerror(errno)) +
           "): you need read and search permission on the dataset directory";
  char real[PATH_MAX];
  std::string real_path = realpath(path.c_str(), real) ? real : path;
  if (real_path == "/") return "the root directory cannot be a dataset";
  // The tiers only when this host can read the configuration (a login node may not).
  Config config;
  try {
    config = load_config(config_path);
  } catch (const std::exception&) {
    return "";
  }
  auto inside = [](const std::string& a, const std::string& b) {
    return a == b || (a.size() > b.size() && a.compare(0, b.size(), b) == 0 &&
                      (b.back() == '/' || a[b.size()] == '/'));
  };
  for (const TierConfig& tier : config.tiers) {
    char tr[PATH_MAX];
    std::string tier_path = realpath(tier.path.c_str(), tr) ? tr : tier.path;
    if (inside(real_path, tier_path) || inside(tier_path, real_path))
      return "overlaps the node-local tier " + tier.path +
             ": the dataset must live on the shared file system, outside " + tier.path;
  }
  return "";
}

std::string check_report_dir(const std::string& dir) {
  if (dir.empty() || dir[0] != '/')
    return "not an absolute path: give the full path of an existing directory";
  struct stat st;
  // The job's end writes into the directory itself, never through a link.
  if (lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode))
    return "a symbolic link; give the directory itself (realpath " + dir + ")";
  if (stat(dir.c_str(), &st) != 0)
    return errno == ENOENT ? "no such directory: create it before you submit"
                           : std::string(std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return "not a directory";
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    return "you cannot write there (" + std::string(std::strerror(errno)) + ")";
  return "";
}

int on_option(int id, const char* optarg, int remote) {
  State& s = state();
  std::string value = optarg ? optarg : "";
  switch (id) {
    case kDataset:
      s.request.dataset_given = true;
      s.request.dataset = value;
      break;
    case kReport:
      s.request.report = value;
      break;
    case kVerbose:
      s.request.verbose = true;
      break;
    default:
      return 0;
  }
  if (remote || !s.args.enabled) return 0;
  std::string why;
  if (id == kDataset) why = check_dataset(value, s.args.config);
  if (id == kReport) why = check_report_dir(value);
  if (why.empty()) return 0;
  std::string option = id == kDataset ? "monarch-dataset" : "monarch-report";
  // An srun inside a job inherits the job's options through the environment:
  // the job was accepted, so its steps run, without Monarch if need be.
  std::string inherited_var = "SLURM_SPANK__SLURM_SPANK_OPTION_" + std::string(plugin_name) + "_" +
                              (id == kDataset ? "monarch_dataset" : "monarch_report");
  const char* inherited = std::getenv(inherited_var.c_str());
  if (std::getenv("SLURM_JOB_ID") && inherited && value == inherited) {
    log_error("--" + option + "=" + value + " (from the job): " + why);
    return 0;
  }
  log_error("--" + option + "=" + value + ": " + why);
  return -1;
}

extern "C" int option_cb(int id, const char* optarg, int remote) noexcept {
  try {
    return on_option(id, optarg, remote);
  } catch (const std::exception& e) {
    slurm_error("monarch: option check failed: %s", e.what());
  } catch (...) {
    slurm_error("monarch: option check failed");
  }
  return -1;
}

char kDatasetName[] = "monarch-dataset";
char kReportName[] = "monarch-report";
char kVerboseName[] = "monarch-verbose";
char kDirArg[] = "DIR";
char kDatasetUsage[] =
    "Stage the dataset in DIR (an absolute path on the shared file system) to "
    "node-local storage for this job: the job's tasks then read it through Monarch, "
    "with no change to the program.";
char kReportUsage[] =
    "Write the Monarch report of the job (monarch-job<ID>.txt, .json, .svg) to DIR, an "
    "existing absolute directory. Default: the site's report_dir, else the job's "
    "working directory.";
char kVerboseUsage[] = "Log Monarch's decisions to each task's stderr (sets MONARCH_LOG=1).";

spank_option options[] = {
    {kDatasetName, kDirArg, kDatasetUsage, 1, kDataset, option_cb},
    {kReportName, kDirArg, kReportUsage, 1, kReport, option_cb},
    {kVerboseName, nullptr, kVerboseUsage, 0, kVerbose, option_cb},
};

}  // namespace

int register_options(spank_t sp) {
  for (spank_option& o : options) {
    spank_err_t rc = spank_option_register(sp, &o);
    if (rc != ESPANK_SUCCESS)
      log_error(std::string("cannot register --") + o.name + ": " + spank_strerror(rc));
  }
  return 0;
}

int job_script_getopt(spank_t sp) {
  Request& r = state().request;
  for (spank_option& o : options) {
    char* value = nullptr;
    if (spank_option_getopt(sp, &o, &value) != ESPANK_SUCCESS) continue;
    if (o.val == kDataset) r.dataset_given = true, r.dataset = value ? value : "";
    if (o.val == kReport) r.report = value ? value : "";
    if (o.val == kVerbose) r.verbose = true;
  }
  return 0;
}

}  // namespace monarch::spank
