// The job's statistics: sums of every process's counters and the stager's,
// epochs (detected when the bytes read reach the dataset's size), and a
// per-second time series. Written as JSON (schema "monarch-stats/1") to the
// job directory every few seconds and at the end; monarch-report renders it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "counters.h"
#include "index.h"
#include "jobmap.h"
#include "placement.h"

namespace monarch {

// Version 2: the series' interval is fractional (0.1 s at first); version 1's
// was whole seconds. Readers accept both.
inline constexpr const char* kStatsSchema = "monarch-stats/2";
inline constexpr const char* kStatsSchemaV1 = "monarch-stats/1";

// What keeps a job's processes from loading the job map, most likely first:
// the words of the report and of the stager's log.
inline constexpr const char* kUnusedCauses =
    "a container that hides the job directory or clears LD_PRELOAD (enroot start, apptainer "
    "--cleanenv: README, \"Containers\"), a static or non-glibc program, or a job that did not "
    "read the dataset";

struct JobInfo {
  std::string job, host, user, dataset, consistency, config_file;
  std::vector<std::string> tier_names, tier_dirs;
  unsigned copy_threads = 0;
  bool stage_ahead = true;
  uint64_t small_file_max = 0;
  int64_t started_unix = 0;
};

class Stats {
 public:
  Stats(const JobMap& map, const std::atomic<uint64_t>* stager, const Placement& placement,
        JobInfo info, IndexStats index);

  // Notes the ends of passes over the dataset (the statistics' "epochs"; a
  // job's epochs when it reads the dataset once an epoch). A pass ends when,
  // since the last one ended, the job has read (mappings apart) as many
  // bytes as the dataset holds AND opened most of its files: the files of
  // each bucket of pass_opens (file number modulo kPassBuckets) count as
  // opened up to the bucket's opens, weighted by their bytes, and a pass
  // needs kPassCover of the dataset's bytes so covered. A job that re-reads
  // a few files counts no pass however many bytes it reads (one file: at
  // most 1/kPassBuckets of the buckets); re-reads spread over most buckets
  // still look like passes, and so do re-reads of a dataset that is one
  // large file. Returns the nanoseconds until it wants to be called again:
  // 100 ms, or 1 ms when the job's bytes near the next boundary, so that
  // each pass's counters are exact to about a millisecond of the job's
  // traffic (the boundary is interpolated by bytes between two polls; when
  // the opens come a poll or more after the bytes, it is the poll).
  // A pass's opens count from the poll before it began (the opens between
  // two polls are not told apart).
  uint64_t tick(uint64_t now_ns);
  static constexpr double kPassCover = 0.5;
  // Every 100 ms or so: closes the time series' intervals that have ended,
  // and notes the job's first process to load the map (Header::attached).
  void sample(uint64_t now_ns);
  // The job's processes that loaded the map, and the first of them: its pid
  // (0 until one has; in its own PID namespace), its command name as the
  // process wrote it, and when, in seconds from the statistics' start (0 for
  // a load before it).
  struct Attached {
    uint32_t processes = 0;
    int32_t first_pid = 0;
    std::string first_command;
    double first_s = 0;
  };
  Attached attached() const;
  // The whole statistics as JSON. `complete`: the stager stopped normally.
  std::string json(bool complete, double fill_seconds) const;

 private:
  struct Snapshot {
    uint64_t t_ns = 0;
    std::array<uint64_t, kNumCounters> p{};
    std::array<uint64_t, kNumStagerCounters> s{};
  };
  Snapshot take(uint64_t now_ns) const;
  // Complete copies, from the job map.
  struct Cached {
    uint64_t files = 0, bytes = 0;
    std::array<uint64_t, kMapTiers> by_tier{};
  };
  Cached complete_copies() const;
  // The share of the dataset's bytes in files opened between two snapshots,
  // as far as the pass_opens buckets tell (see tick).
  double opened_share(const Snapshot& from, const Snapshot& to) const;
  // Halves the time series' resolution (REQUIRES mu_ held).
  void halve();
  // Takes the first process's pid and time from the map, once the library has
  // written both, and keeps them (REQUIRES mu_ held).
  void note_first_attached() const;

  const JobMap& map_;
  const std::atomic<uint64_t>* stager_;
  const Placement& placement_;
  JobInfo info_;
  IndexStats index_;
  uint64_t start_ns_;
  // Files and bytes of the dataset in each pass_opens bucket.
  std::array<uint64_t, kPassBuckets> bucket_files_{}, bucket_bytes_{};

  mutable std::mutex mu_;
  std::vector<Snapshot> epochs_;  // cumulative counters at each epoch's end
  Snapshot poll_;                 // the last tick's
  Snapshot pass_opens_from_;      // the current pass's opens count from here (tick)
  Snapshot rate_from_;            // the job's read rate (per_ns_) is measured from here
  double per_ns_ = 0;
  // Time series: per interval, bytes served from each tier, from the PFS
  // (direct reads and bytes read whole at open), and bytes of complete
  // copies per tier (counted at most every second: cached_now_, at cached_ms_).
  uint64_t interval_ms_;
  uint64_t cached_ms_ = 0;
  std::array<uint64_t, kMapTiers> cached_now_{};
  Snapshot last_;
  mutable Attached first_;  // processes unused; the rest set once, by note_first_attached()
  std::vector<std::array<uint64_t, kMapTiers + 2>> served_;  // tiers..., pfs, stager copies
  std::vector<std::array<uint64_t, kMapTiers>> cached_;
};

// `s` as Unicode text: each byte that is not part of valid UTF-8 (a path in
// Latin-1, a command name a process set) as the four characters \xNN, as
// shown() writes a control character. JSON holds only Unicode: the
// statistics' reader refuses any other byte.
std::string as_utf8(std::string_view s);
// A JSON string of as_utf8(s), quoted and escaped.
std::string json_string(std::string_view s);

}  // namespace monarch
