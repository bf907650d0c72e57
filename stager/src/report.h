// Rendering a job's statistics (stats.json, schema monarch-stats/1, written by
// stats.cpp) for people and scripts: the terminal summary with a verdict, the
// report JSON (schema monarch-report/1: the figures below plus the statistics
// embedded), and a self-contained SVG picture. Pure functions of the JSON text
// except write_reports; thread-safe; no global state.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace monarch {

inline constexpr const char* kReportSchema = "monarch-report/1";

// Bad input, phrased for the user: what is wrong with the file (the caller
// names the file).
struct ReportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Without Monarch every open and read the job made would have reached the
// PFS; with it, what reached the PFS is the job's own PFS calls plus the
// stager's. avoided = without - with (negative when the stager copied ahead
// more than the job read in that span: the report then says how much more,
// never a share below 0%). Mapped bytes are neither: their pages are read
// unseen.
struct Traffic {
  double opens = 0, reads = 0, bytes = 0;              // the job's calls (counters opens...)
  double pfs_opens = 0, pfs_reads = 0, pfs_bytes = 0;  // what reached the PFS (job + stager;
                                                       // bytes: the fast-fs check's too)
  double job_pfs_opens = 0, job_pfs_reads = 0, job_pfs_bytes = 0;  // of which the job's
  double job_pfs_read_ns = 0;                                      // time in them
  double stager_pfs_bytes = 0;  // of which the stager's (its opens and reads: the difference)
  double stager_copied = 0;     // bytes the stager cached from the PFS (read + handed off)
  double local_reads = 0, local_bytes = 0;  // answered from node-local tiers (tier_*)
  // Mappings, apart from reads (their pages are read unseen): how many, the
  // bytes they spanned, and of those what mapped a node-local copy.
  double mmaps = 0, mmap_bytes = 0, mmap_local = 0, mmap_local_bytes = 0;
  // A multi-node job's cache: bytes this node sent the others, received from
  // them (copies and reads passed on), nodes it gave up on; 1 when it cached
  // on its own, outside the job's cache.
  double peer_sent = 0, peer_received = 0, peers_failed = 0, alone = 0;
  // Its index: 0 when walked here, else the node it came from (its place in
  // the job's node list, plus 1); the index's bytes it received and sent;
  // when it held the index whole (ms after its start); the stager's peak
  // resident memory.
  double index_source = 0, index_in = 0, index_out = 0, index_ms = 0, peak_memory = 0;
  double hit() const { return bytes > 0 ? local_bytes / bytes : 0; }
  double read_hit() const { return reads > 0 ? local_reads / reads : 0; }
};

// One pass over the dataset (the statistics' "epochs": stats.h, Stats::tick,
// says when one ends): the job's epoch when it reads the dataset once an
// epoch, which the report cannot know, so it says "pass".
struct EpochFigures {
  int number = 0;
  bool complete = false;  // the job read the dataset's worth of bytes and most of its files
  double start_s = 0, seconds = 0;
  Traffic traffic;
  // Complete, and the stager read under 1% of the epoch's bytes from the PFS:
  // the epoch shows the job's steady state, not the fill.
  bool steady = false;
  double rate() const { return seconds > 0 ? traffic.bytes / seconds : 0; }
};

// The verdict: the I/O roofline of HPE's "data-aware storage tiering" slides
// applied to one job. All rates in bytes/s; 0 means "not measured".
//   S  = index.bytes, the dataset size.
//   h  = cached.bytes / S, the fraction on node-local tiers at the end.
//   C  = the job's consumption rate with all its data local (computation
//        plus local reads: what the job does when the PFS is out of the way).
//        Measured: the median of bytes/seconds over steady epochs with local
//        hits >= 99% (C_source "cached epochs"). Without one, estimated from
//        the last steady epoch e that read part of its data from the PFS:
//        bytes_e / (seconds_e - W_e), W_e = the job's time in PFS reads
//        (pfs_read_ns, summed over readers), when W_e < 0.9·seconds_e
//        (C_source "epoch N less its PFS reads"). Exact for readers that wait
//        for each read; too high for readers that overlap them, which errs
//        towards more capacity.
//   B2 = the PFS's rate to this node. Preferred: the fill, (stager.pfs_bytes +
//        stager.handoff_bytes) / cached.fill_seconds, when the stager copied
//        ahead (settings.stage_ahead) and finished: the wall-clock rate at which
//        the dataset came from the PFS with the stager's copy threads in
//        parallel. Not the per-call read time scaled by the thread count: that
//        assumes every thread was busy at once and overstates the rate in a
//        fill's tail; not the epoch-1 rate: that is the slower of the PFS and
//        the job itself, on a PFS shared with the stager's copies. Fallbacks,
//        named in B2_source: "stager reads" = stager.pfs_bytes /
//        (stager.pfs_read_ns / copy_threads), an upper bound; "job reads" =
//        pfs_bytes / pfs_read_ns of the job's processes, one reader's rate, a
//        lower bound.
//   B1 = local_sample_bytes / local_sample_ns: one local read call's rate.
// A steady epoch takes at least max(S/C, (1-h)·S/B2). The least cached
// fraction for which the PFS is no bottleneck is h* = max(0, 1 - B2/C)
// (from (1-h*)·S/B2 <= S/C); capacity_needed = h*·S, against quota (the sum of
// the tiers' quotas).
//   bound = "pfs"        if h < h* - 0.01 (one point of slack for measured rates);
//           "local tier" if not, C was measured and C >= 0.8·B1: in the fully
//                        cached epochs the job's readers spent >= 80% of the
//                        elapsed time in local reads (C/B1 = time in local
//                        reads / elapsed, summed over readers);
//           "compute"    otherwise.
// When W_e >= 0.9·seconds_e, C cannot be estimated but the readers were
// waiting for the PFS nearly all the time: "pfs", h* unknown. Without a
// steady epoch: "undecided"; `reason` says what is missing. The roofline
// assumes the job overlaps reading and computing (loader workers, prefetch);
// a job that reads serially needs h = 1 to lose all its PFS time.
struct Verdict {
  double S = 0, h = 0, B1 = 0, B2 = 0, C = 0;
  std::string B2_source;      // "fill", "stager reads", "job reads", or "" (none)
  std::string C_source;       // "cached epochs", "epoch N less its PFS reads", or "" (none)
  std::vector<int> C_epochs;  // the epochs C comes from
  std::string C_words;        // how C was found, with the figures
  int pfs_wait_epoch = 0;     // the partial steady epoch C was estimated from (or not), or 0
  double pfs_wait_share = 0;  // its W_e / seconds_e
  double h_needed = -1;       // h*, -1 when it cannot be decided
  double capacity_needed = -1, quota = 0;
  std::string bound;        // "compute", "pfs", "local tier", or "undecided"
  std::string reason;       // sentences with the figures, for the summary
  std::string first_epoch;  // how epoch 1 (the fill) compares, or ""
};

// One fallback or limit, in plain words ("3 files did not fit on any tier").
struct Fallback {
  std::string counter;  // as named in the statistics: "fb_wait", "stager.noroom"
  double count = 0;
  std::string text;  // the whole sentence, count included
};

struct Figures {
  std::string job, host, user, dataset;
  std::string title;      // the job for people: "job 42" (key job42), "monarch-run 4711" (run-4711)
  bool complete = false;  // false: the stager was killed; the last periodic flush
  double elapsed_s = 0;
  double files = 0, dataset_bytes = 0, cached_files = 0, cached_bytes = 0, fill_seconds = 0;
  struct Tier {
    std::string name;
    double quota = 0, used = 0;
    bool full = false;
  };
  std::vector<Tier> tiers;
  Traffic total;
  // The job's processes that loaded the job map ("attached" in the
  // statistics; -1 in statistics written before it was counted), and the
  // first of them (pid 0: none). used_monarch is false only when none did
  // and no counter shows a process's call either: every read of the job
  // went to the PFS unseen, and the other figures describe the stager alone.
  double attached = -1;
  double first_pid = 0, first_attached_s = 0;
  std::string first_command;
  bool used_monarch = true;
  std::vector<EpochFigures> epochs;
  std::vector<Fallback> fallbacks;  // when !used_monarch, the first says so and why
  Verdict verdict;
};

// The statistics in `json` as text: all of it, or what a report embeds.
// Throws ReportError.
std::string stats_of(const std::string& json);

// Parses statistics or a report (which embeds them). Throws ReportError.
Figures figures(const std::string& json);

// The short text summary. Throws ReportError.
std::string summary_text(const std::string& json);
// The summary of a job of several nodes, from each node's statistics or
// report: the whole job's PFS traffic, what the nodes sent each other, the
// slowest node, the nodes whose stager did not finish. Throws ReportError.
std::string job_summary_text(const std::vector<std::string>& jsons);
// The report JSON (schema monarch-report/1), one line. Throws ReportError.
std::string report_json(const std::string& json);
// The picture: bytes/s per source over time, epochs, cached fraction (SVG).
// Throws ReportError.
std::string report_svg(const std::string& json);
// Every counter of the statistics with its meaning (from counters.h).
std::string explain_text();

// The most statistics monarch-report reads: a job's stats.json is a few
// hundred KiB (the time series is capped; an epoch takes about 1.4 KiB, its
// 64 pass_opens included, and 16 MiB hold 11,000 epochs). Parsing takes
// about 65 times the file's size
// (measured: 16 MiB, 1.0 GiB and 6 s), which keeps the report at a job's
// end within its 2 GiB and 20 s. A larger file is refused unread.
inline constexpr size_t kMaxStatsBytes = 16 << 20;

// Writes `text` to `path` through a new temporary file in the same directory
// (O_EXCL | O_NOFOLLOW, mode 0666 less the umask) and rename(2): readers see
// the old file or the new one, never a part. Throws std::runtime_error
// naming the path.
void write_atomically(const std::string& path, const std::string& text);

// Writes monarch-<job>.txt, .json and .svg into `dir`, as the calling user,
// safely in a directory other users can write (a shared report_dir): the
// files are made in a private directory made there (O_EXCL, mode 0666 less
// the umask) and renamed into place, never replacing anything that is not
// the caller's own regular file, never following a link. Every node of a
// job writes into the same directory: when monarch-<job>.json there is
// another host's report, the names become monarch-<job>-<host>.*; when a
// name is held by another user, monarch-<job>-<host>-<random>.*. Returns the
// three paths. Throws ReportError (bad input) or std::runtime_error (cannot
// write).
std::vector<std::string> write_reports(const std::string& json, const std::string& dir);

// Writes monarch-<job>.txt in `dir`, as write_reports would, holding only
// `line`: what the job's end says when there is no report to write.
std::string write_note(const std::string& job, const std::string& line, const std::string& dir);

}  // namespace monarch
