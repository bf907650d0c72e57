// Rendering a job's statistics (stats.json, schema monarch-stats/1) for
// people and scripts: the terminal summary with a verdict, the report JSON
// (schema monarch-report/1), and a self-contained SVG picture.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace monarch {

inline constexpr const char* kReportSchema = "monarch-report/1";

// Bad input, phrased for the user: what is wrong with the file.
struct ReportError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What would have reached the PFS without Monarch against what did.
struct Traffic {
  double opens = 0, reads = 0, bytes = 0;              // the job's own calls
  double pfs_opens = 0, pfs_reads = 0, pfs_bytes = 0;  // what reached the PFS (job + stager)
  double local_bytes = 0;                              // answered from node-local tiers
  double hit() const { return bytes > 0 ? local_bytes / bytes : 0; }
};

struct EpochFigures {
  int number = 0;
  bool complete = false;
  double start_s = 0, seconds = 0;
  Traffic traffic;
};

// The I/O roofline of the job (HPE's data-aware tiering slides): an epoch
// takes at least max(S/C, (1-h)·S/B2), where S is the dataset size, h the
// cached fraction, B2 the PFS read rate and C the rate at which the job
// consumes data when everything is local (a fully cached epoch).
struct Verdict {
  double S = 0, h = 0;
  double B1 = 0;        // local read rate of one reader: timed local reads (bytes/s)
  double B2 = 0;        // PFS read rate: the stager's copies, bytes over the fill time (bytes/s)
  double C = 0;         // consumption rate in fully cached epochs (bytes/s), 0 if none
  double h_needed = 0;  // 1 - B2/C: the cached fraction that makes the PFS no bottleneck
  double capacity_needed = 0, quota = 0;
  std::string bound;   // "compute", "pfs", "local tier", or "undecided"
  std::string reason;  // one sentence, with the figures
};

struct Figures {
  std::string job, host, user, dataset;
  bool complete = false;
  double elapsed_s = 0;
  double files = 0, dataset_bytes = 0, cached_files = 0, cached_bytes = 0, fill_seconds = 0;
  struct Tier {
    std::string name;
    double quota = 0, used = 0;
    bool full = false;
  };
  std::vector<Tier> tiers;
  Traffic total;
  std::vector<EpochFigures> epochs;
  std::vector<std::string> fallbacks;  // in plain words
  Verdict verdict;
};

// The statistics in `json`: all of it, or what a report embeds. Throws ReportError.
std::string stats_of(const std::string& json);

// Parses statistics or a report (which embeds them). Throws ReportError.
Figures figures(const std::string& json);

// The short text summary. Throws ReportError.
std::string summary_text(const std::string& json);
// The report JSON: derived figures plus the statistics. Throws ReportError.
std::string report_json(const std::string& json);
// The picture: bytes/s per source over time, epochs, cached fraction.
std::string report_svg(const std::string& json);
// Writes monarch-<job>.txt, .json and .svg into `dir`, each atomically.
// Returns the paths. Throws ReportError (bad input) or std::runtime_error.
std::vector<std::string> write_reports(const std::string& json, const std::string& dir);

}  // namespace monarch
