// Configuration of a Monarch node: the ordered node-local tiers and the
// stager's settings. The file format and every key are documented in
// etc/monarch.conf; this header is the single place that knows them.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace monarch {

inline constexpr int kMaxTiers = 4;  // node-local tiers; the dataset's file system comes after

// How long a copy stays valid (README, "Consistency").
enum class Consistency {
  kJob,   // the dataset is read-only for the job's lifetime: no PFS metadata call for cached files
  kOpen,  // every open compares the PFS file with the index; a changed file is read from the PFS
};

// What the Slurm plugin makes for a job on each tier (etc/monarch.conf,
// job_space; README, "Tier directories"). monarch-run always uses directories.
enum class JobSpace {
  kImage,      // a file system image of the quota's size, loop-mounted: the quota holds
  kDirectory,  // a plain directory: the quota binds the stager only
};

struct TierConfig {
  std::string name;          // from the section name [tier.NAME]
  std::string path;          // parent of the per-job directories
  uint64_t quota_bytes = 0;  // fixed quota, or 0 when quota_percent is used
  double quota_percent = 0;  // share of the tier's file system size, resolved at start
  uint64_t block_size = 4 << 20;
};

// The least window a share of the dataset gives: a few MiB save the PFS
// nothing measurable, and a small dataset (a demo, a test) is staged whole.
inline constexpr uint64_t kMinAheadWindow = 4 << 20;

struct Config {
  std::vector<TierConfig> tiers;  // fastest first
  unsigned copy_threads = 8;
  std::string log_level = "info";
  std::string report_dir;  // empty: the job's working directory
  Consistency consistency = Consistency::kJob;
  uint64_t small_file_max = 1 << 20;
  bool stage_ahead = true;
  // How far stage-ahead may copy ahead of the files readers have touched:
  // bytes, or a share of the dataset (window_percent), resolved once indexed.
  uint64_t stage_ahead_window = 0;
  double stage_ahead_window_percent = 4;
  bool copy_fast_dataset = false;  // copy a dataset that reads as fast as a tier
  // A reader waits at most this long for a copy without progress.
  unsigned stall_timeout_ms = 200;
  unsigned index_rate = 0;  // metadata calls per second the index walk may make, 0: unpaced
  unsigned start_timeout_s = 30;
  unsigned stop_timeout_s = 10;
  JobSpace job_space = JobSpace::kImage;
  // Multi-node jobs (issue 9): the nodes of a job cache the dataset as one
  // (jobwide.h); no: each node on its own, as for a one-node job.
  bool job_wide = true;
  // The stagers of a job listen on a port of this range that only the job's
  // key gives (spank/job_key.h).
  unsigned peer_port_low = 7400, peer_port_high = 7899;
  // A file every node holds alike and only root reads: the plugin derives
  // each job's key from it (spank/job_key.h).
  std::string job_key_secret = "/etc/munge/munge.key";
  unsigned peer_timeout_ms = 1000;  // a peer silent this long is failed for the job
  std::string source;               // the file it was read from, for messages
};

// A configuration error, already phrased for the admin: file, line, key,
// value and what is accepted.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads and validates a configuration file. Throws ConfigError.
Config load_config(const std::string& path);
// The same from the file's text; `path` names it in messages and in
// Config::source. Throws ConfigError.
Config parse_config(const std::string& text, const std::string& path);

// "4096", "64K", "4M", "2G", "1T" (powers of 1024). Throws std::invalid_argument
// whose message says what is accepted.
uint64_t parse_size(std::string_view text);

// Replaces the tiers with command-line ones, "DIR" or "DIR:QUOTA" where QUOTA is
// a size or a percentage (default 100%). Throws ConfigError.
void override_tiers(Config& config, const std::vector<std::string>& specs);

// The job's own directory on a tier: <tier path>/monarch-<job>. The one on
// the first tier also holds the job map, the socket and the statistics.
std::string job_dir(const TierConfig& tier, const std::string& job);

// A job key is what names the job's directories: letters, digits, '.', '_', '-'.
bool valid_job_key(std::string_view job);

// The dataset root `given` (relative to the working directory, or absolute)
// as an absolute, lexically normal path, checked to be a directory the caller
// can list and outside every tier. Throws ConfigError saying what is wrong.
std::string check_dataset(const std::string& given, const Config& config);

// Formats a byte count for people: "1.5 GiB".
std::string human_bytes(double bytes);

}  // namespace monarch
