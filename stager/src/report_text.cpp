// The report's text forms: the terminal summary, the report JSON, the
// counters' meanings (report_write.cpp writes them into a directory).
#include <algorithm>
#include <cmath>
#include <sstream>

#include "config.h"
#include "report.h"
#include "report_internal.h"
#include "stats.h"

namespace monarch {
using namespace report_internal;

namespace {

// "50.0% of bytes (1000 B), 66.7% of opens (20), 50.0% of reads (40)". When
// the PFS saw more than the job asked for (the stager copying ahead for
// later passes), no share: "none: 1.0 MiB more than without Monarch".
std::string avoided(const Traffic& t) {
  auto one = [](const char* what, double without, double with, bool bytes) {
    double d = without - with;
    std::string n = bytes ? human_bytes(std::fabs(d)) : count(std::fabs(d));
    if (d < 0)
      return std::string("none of ") + what + " (" + n +
             " more than without Monarch: copies ahead)";
    return pct(d, without) + " of " + what + " (" + n + ")";
  };
  return one("bytes", t.bytes, t.pfs_bytes, true) + ", " +
         one("opens", t.opens, t.pfs_opens, false) + ", " +
         one("reads", t.reads, t.pfs_reads, false);
}

// The mappings, apart from reads: "", or the line that counts them.
std::string mappings_line(const Traffic& t) {
  if (t.mmaps <= 0) return "";
  return "  mappings: " + count(t.mmaps) + " (" + count(t.mmap_local) + " of node-local copies), " +
         human_bytes(t.mmap_bytes) + " mapped (" + pct(t.mmap_local_bytes, t.mmap_bytes) +
         " of it local): their pages are read unseen, so they are counted neither as reads nor "
         "in passes\n";
}

// The first process that used Monarch is named in the summary when it came
// late: a tenth of the job's time (and a second) after the map was ready.
bool late_attach(const Figures& f) {
  return f.first_pid > 0 && f.first_attached_s >= std::max(1.0, f.elapsed_s / 10);
}

// "10.00 s, 2.00 s, 2.50 s": every pass's time; of a long job the first
// three, the last and the median.
std::string epoch_times(const std::vector<EpochFigures>& all, double dataset_bytes) {
  if (all.empty()) return "none yet (the job read less than the dataset holds)";
  if (all.size() == 1 && !all[0].complete && dataset_bytes > 0 &&
      all[0].traffic.bytes >= dataset_bytes)
    return "none: the job read " + fmt("%.1f", all[0].traffic.bytes / dataset_bytes) +
           "x the dataset's bytes, re-reading a few of its files (a pass opens most of them)";
  auto one = [](const EpochFigures& e) {
    return fmt("%.2f", e.seconds) + " s" + (e.complete ? "" : " (partial)");
  };
  std::string s;
  if (all.size() <= 8) {
    for (const EpochFigures& e : all) s += (s.empty() ? "" : ", ") + one(e);
    return s;
  }
  std::vector<double> times;
  for (const EpochFigures& e : all) times.push_back(e.seconds);
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return one(all[0]) + ", " + one(all[1]) + ", " + one(all[2]) + " ... " + one(all.back()) + " (" +
         std::to_string(all.size()) + " passes; median " + fmt("%.2f", times[times.size() / 2]) +
         " s)";
}

// Epochs to list one by one: all of a short job; of a long one the first
// two, the middle summed, and the last.
std::vector<EpochFigures> epochs_to_show(const std::vector<EpochFigures>& all) {
  if (all.size() <= 6) return all;
  std::vector<EpochFigures> out = {all[0], all[1]};
  EpochFigures mid = all[2];
  for (size_t i = 3; i + 1 < all.size(); ++i) {
    const Traffic& x = all[i].traffic;
    Traffic& m = mid.traffic;
    m.opens += x.opens, m.reads += x.reads, m.bytes += x.bytes;
    m.pfs_opens += x.pfs_opens, m.pfs_reads += x.pfs_reads, m.pfs_bytes += x.pfs_bytes;
    m.local_reads += x.local_reads, m.local_bytes += x.local_bytes;
    mid.seconds += all[i].seconds;
  }
  mid.number = -int(all.size() - 2);  // "epochs 3-N" below
  out.push_back(mid);
  out.push_back(all.back());
  return out;
}

// A JSON number; integers exactly, null for what is not finite.
std::string jnum(double v) {
  if (!std::isfinite(v)) return "null";
  if (v == std::floor(v) && std::fabs(v) < 9e15) return fmt("%.0f", v);
  return fmt("%.10g", v);
}
std::string jfrac(double part, double whole) {
  return whole > 0 ? jnum(part / whole) : "null";
}
// A share of traffic avoided: 0 when there was more than without Monarch
// (the signed difference is beside it).
std::string jshare(double part, double whole) {
  return whole > 0 ? jnum(std::clamp(part / whole, 0.0, 1.0)) : "null";
}

std::string traffic_json(const Traffic& t) {
  std::ostringstream o;
  o << "{\"opens\":" << jnum(t.opens) << ",\"reads\":" << jnum(t.reads)
    << ",\"bytes\":" << jnum(t.bytes) << ",\"pfs_opens\":" << jnum(t.pfs_opens)
    << ",\"pfs_reads\":" << jnum(t.pfs_reads) << ",\"pfs_bytes\":" << jnum(t.pfs_bytes)
    << ",\"job_pfs_opens\":" << jnum(t.job_pfs_opens)
    << ",\"job_pfs_reads\":" << jnum(t.job_pfs_reads)
    << ",\"job_pfs_bytes\":" << jnum(t.job_pfs_bytes)
    << ",\"stager_pfs_opens\":" << jnum(t.pfs_opens - t.job_pfs_opens)
    << ",\"stager_pfs_reads\":" << jnum(t.pfs_reads - t.job_pfs_reads)
    << ",\"stager_pfs_bytes\":" << jnum(t.stager_pfs_bytes)
    << ",\"local_reads\":" << jnum(t.local_reads) << ",\"local_bytes\":" << jnum(t.local_bytes)
    << ",\"mmaps\":" << jnum(t.mmaps) << ",\"mmap_bytes\":" << jnum(t.mmap_bytes)
    << ",\"mmap_local\":" << jnum(t.mmap_local)
    << ",\"mmap_local_bytes\":" << jnum(t.mmap_local_bytes)
    << ",\"local_hit\":" << jfrac(t.local_bytes, t.bytes)
    << ",\"local_read_hit\":" << jfrac(t.local_reads, t.reads)
    << ",\"avoided\":{\"opens\":" << jnum(t.opens - t.pfs_opens)
    << ",\"reads\":" << jnum(t.reads - t.pfs_reads) << ",\"bytes\":" << jnum(t.bytes - t.pfs_bytes)
    << ",\"opens_fraction\":" << jshare(t.opens - t.pfs_opens, t.opens)
    << ",\"reads_fraction\":" << jshare(t.reads - t.pfs_reads, t.reads)
    << ",\"bytes_fraction\":" << jshare(t.bytes - t.pfs_bytes, t.bytes) << "}}";
  return o.str();
}

std::string capacity_line(const Verdict& v) {
  if (v.h_needed < 0) return "";
  std::string s = "local capacity for a compute-bound job: " + human_bytes(v.capacity_needed) +
                  " (" + pct(v.h_needed, 1) +
                  " of the dataset); configured: " + human_bytes(v.quota);
  if (v.quota <= 0) return s;
  return s + (v.quota >= v.capacity_needed
                  ? " (enough)"
                  : " (short by " + human_bytes(v.capacity_needed - v.quota) + ")");
}

// The cached copies, the tiers' use, the notes from the `first`: the end of
// every summary.
std::string cached_and_notes(const Figures& f, size_t first = 0) {
  std::ostringstream o;
  o << "  cached: " << count(f.cached_files) << " files, " << human_bytes(f.cached_bytes) << " ("
    << pct(f.cached_bytes, f.dataset_bytes) << " of the dataset)";
  if (f.fill_seconds > 0) o << " in " << fmt("%.1f", f.fill_seconds) << " s";
  for (const Figures::Tier& tier : f.tiers)
    o << "; " << tier.name << " " << human_bytes(tier.used) << " of " << human_bytes(tier.quota);
  o << "\n";
  if (!f.complete)
    o << "  note: the statistics are incomplete: the stager did not stop normally (killed?); "
         "they end at its last periodic flush, "
      << fmt("%.1f", f.elapsed_s) << " s after it started\n";
  for (size_t i = first; i < f.fallbacks.size(); ++i)
    o << "  note: " << f.fallbacks[i].text << "\n";
  return o.str();
}

// A job none of whose processes used Monarch, or whose processes opened no
// dataset file through it: no share, epoch or verdict (nothing of the job
// was seen); `why`, then what the stager did and the notes from `first`.
std::string unused_summary(const Figures& f, const std::string& why, size_t first) {
  const Traffic& t = f.total;
  std::ostringstream o;
  o << "  " << why << "\n";
  o << "  the stager's copies meanwhile: " << count(t.pfs_opens - t.job_pfs_opens) << " opens, "
    << count(t.pfs_reads - t.job_pfs_reads) << " reads, " << human_bytes(t.stager_pfs_bytes)
    << " from the PFS"
    << (t.stager_pfs_bytes > 0 ? " (stage-ahead's first window: it goes further only as readers "
                                 "read)\n"
                               : "\n");
  return o.str() + cached_and_notes(f, first);
}

// The one line for a job whose processes loaded the job map but never
// opened a dataset file through Monarch.
std::string untouched(const Figures& f) {
  return "the job opened no dataset file through Monarch, though " +
         (f.attached > 0 ? count(f.attached) + " of its processes" : std::string("its processes")) +
         " loaded the job map: it read the dataset, if at all, by a path Monarch did not "
         "recognise as the dataset (another mount of its file system, a copy, a path relative "
         "to a directory descriptor), from the PFS; read it through " +
         f.dataset +
         ", a symbolic link to it or a bind mount of it, or give as the dataset "
         "the directory the program reads";
}

}  // namespace

std::string job_summary_text(const std::vector<std::string>& jsons) {
  std::vector<Figures> nodes;
  for (const std::string& j : jsons) nodes.push_back(figures(j));
  double pfs = 0, job_pfs = 0, sent = 0, received = 0, dataset = 0;
  const Figures* slowest = nullptr;
  std::string unfinished, gave_up, alone, unused;
  for (const Figures& f : nodes) {
    pfs += f.total.pfs_bytes;
    job_pfs += f.total.job_pfs_bytes;
    sent += f.total.peer_sent;
    received += f.total.peer_received;
    dataset = std::max(dataset, f.dataset_bytes);
    if (!slowest || f.elapsed_s > slowest->elapsed_s) slowest = &f;
    if (!f.complete) unfinished += (unfinished.empty() ? "" : ", ") + f.host;
    if (f.total.peers_failed > 0)
      gave_up += (gave_up.empty() ? "" : ", ") + f.host + " (" + count(f.total.peers_failed) + ")";
    if (f.total.alone > 0) alone += (alone.empty() ? "" : ", ") + f.host;
    if (!f.used_monarch) unused += (unused.empty() ? "" : ", ") + f.host;
  }
  std::ostringstream o;
  o << "monarch: " << nodes[0].title << " on " << nodes.size() << " nodes, dataset "
    << nodes[0].dataset << " (" << human_bytes(dataset) << ")\n";
  o << "  PFS traffic of the whole job: " << human_bytes(pfs) << " ("
    << fmt("%.2f", dataset > 0 ? pfs / dataset : 0) << "x the dataset; the readers "
    << human_bytes(job_pfs) << ", the stagers' copies " << human_bytes(pfs - job_pfs) << ")\n";
  o << "  between the nodes: " << human_bytes(sent) << " sent, " << human_bytes(received)
    << " received\n";
  for (const Figures& f : nodes) {
    const Traffic& t = f.total;
    o << "    " << f.host << ": sent " << human_bytes(t.peer_sent) << ", received "
      << human_bytes(t.peer_received) << ", PFS " << human_bytes(t.pfs_bytes) << ", "
      << fmt("%.1f", f.elapsed_s) << " s; index "
      << (t.alone > 0          ? "its own"
          : t.index_source > 0 ? "from node " + count(t.index_source - 1)
                               : std::string("walked here"))
      << (t.index_ms > 0 ? " at " + fmt("%.1f", t.index_ms / 1000) + " s" : "");
    if (t.index_in + t.index_out > 0)
      o << " (" << human_bytes(t.index_in) << " in, " << human_bytes(t.index_out) << " out)";
    if (t.peak_memory > 0) o << "; stager's memory at most " << human_bytes(t.peak_memory);
    o << "\n";
  }
  o << "  slowest node: " << slowest->host << " (" << fmt("%.1f", slowest->elapsed_s) << " s)\n";
  if (!gave_up.empty())
    o << "  nodes that gave another node up (dead, hung or unreachable): " << gave_up << "\n";
  if (!alone.empty())
    o << "  nodes that cached on their own, outside the job's cache: " << alone << "\n";
  if (!unused.empty())
    o << "  nodes where no process of the job used Monarch (" << kUnusedCauses << "): " << unused
      << "\n";
  if (!unfinished.empty())
    o << "  stagers that did not finish (killed; their figures stop at their last flush): "
      << unfinished << "\n";
  return o.str();
}

std::string summary_text(const std::string& json) {
  Figures f = figures(json);
  std::ostringstream o;
  const Traffic& t = f.total;
  o << "monarch: " << f.title << (f.host.empty() ? "" : " on " + f.host) << ", dataset "
    << f.dataset << " (" << count(f.files) << " files, " << human_bytes(f.dataset_bytes) << ")"
    << (f.complete ? "" : " [incomplete]") << "\n";
  if (!f.used_monarch) return o.str() + unused_summary(f, f.fallbacks[0].text, 1);
  if (t.opens == 0 && t.reads == 0) return o.str() + unused_summary(f, untouched(f), 0);
  // First what a user wants to know, then the detail.
  o << "  passes over the dataset: " << epoch_times(f.epochs, f.dataset_bytes) << "\n";
  if (t.reads <= 0 && t.mmaps > 0)
    o << "  served from node-local tiers: no reads (the job mapped the dataset: see mappings)\n";
  else
    o << "  served from node-local tiers: " << pct(t.local_bytes, t.bytes) << " of the bytes read, "
      << pct(t.local_reads, t.reads) << " of reads\n";
  o << "  PFS traffic avoided: " << avoided(t) << "\n";
  o << "  the job read " << human_bytes(t.bytes) << " in " << count(t.opens) << " opens and "
    << count(t.reads) << " reads: all of it would reach the PFS without Monarch\n";
  o << mappings_line(t);
  o << "  PFS with Monarch: " << count(t.pfs_opens) << " opens, " << count(t.pfs_reads)
    << " reads, " << human_bytes(t.pfs_bytes) << " (the job " << count(t.job_pfs_opens) << ", "
    << count(t.job_pfs_reads) << ", " << human_bytes(t.job_pfs_bytes) << "; the stager's copies "
    << count(t.pfs_opens - t.job_pfs_opens) << ", " << count(t.pfs_reads - t.job_pfs_reads) << ", "
    << human_bytes(t.stager_pfs_bytes);
  // The rest of the bytes: the fast-file-system check read copies' first bytes again.
  if (double check = t.pfs_bytes - t.job_pfs_bytes - t.stager_pfs_bytes; check > 0)
    o << "; the file system check " << human_bytes(check);
  o << ")\n";
  for (const EpochFigures& e : epochs_to_show(f.epochs)) {
    const Traffic& x = e.traffic;
    if (e.number < 0)
      o << "  passes 3-" << -e.number << ": ";
    else
      o << "  pass " << e.number << (e.complete ? "" : " (partial)") << ": ";
    o << fmt("%.2f", e.seconds) << " s, local " << pct(x.local_bytes, x.bytes) << ", "
      << rate(e.rate()) << "; PFS " << count(x.pfs_opens) << " opens, " << count(x.pfs_reads)
      << " reads, " << human_bytes(x.pfs_bytes) << "\n    avoided " << avoided(x) << "\n";
  }
  if (late_attach(f))
    o << "  the first process to use Monarch: pid " << count(f.first_pid) << " (" << f.first_command
      << "), " << fmt("%.1f", f.first_attached_s)
      << " s after the map was ready: any read of the dataset before then went to the PFS "
         "unseen\n";
  o << cached_and_notes(f);
  const Verdict& v = f.verdict;
  std::string lines = "verdict: " + (v.bound == "undecided" ? v.bound : v.bound + "-bound") +
                      " - " + v.reason + ".";
  if (v.C > 0 && v.B2 > 0)
    lines +=
        "\nroofline (reading overlapped with computing): a steady epoch takes at least "
        "max(S/C, (1-h)*S/B2) = max(" +
        fmt("%.2f", v.S / v.C) + " s, " + fmt("%.2f", (1 - v.h) * v.S / v.B2) +
        " s) with S = " + human_bytes(v.S) + ", h = " + pct(v.h, 1) +
        " cached; h* = max(0, 1 - B2/C) = " + pct(v.h_needed, 1) + ".";
  if (std::string c = capacity_line(v); !c.empty()) lines += "\n" + c + ".";
  if (!v.first_epoch.empty()) lines += "\n" + v.first_epoch + ".";
  // One line each, unwrapped: the terminal wraps, grep finds.
  std::istringstream in(lines);
  bool first = true;
  for (std::string line; std::getline(in, line); first = false)
    o << (first ? "  " : "    ") << line << "\n";
  return o.str();
}

std::string report_json(const std::string& json) {
  Parsed p = parse(json);
  Figures f = figures(json);
  const Verdict& v = f.verdict;
  std::ostringstream o;
  o << "{\"schema\":" << json_string(kReportSchema) << ",\"job\":" << json_string(f.job)
    << ",\"host\":" << json_string(f.host) << ",\"user\":" << json_string(f.user)
    << ",\"dataset\":" << json_string(f.dataset)
    << ",\"complete\":" << (f.complete ? "true" : "false") << ",\"elapsed_s\":" << jnum(f.elapsed_s)
    << ",\"dataset_files\":" << jnum(f.files) << ",\"dataset_bytes\":" << jnum(f.dataset_bytes)
    << ",\"cached\":{\"files\":" << jnum(f.cached_files) << ",\"bytes\":" << jnum(f.cached_bytes)
    << ",\"fraction\":" << jfrac(f.cached_bytes, f.dataset_bytes)
    << ",\"fill_seconds\":" << jnum(f.fill_seconds) << "},\"tiers\":[";
  for (size_t i = 0; i < f.tiers.size(); ++i)
    o << (i ? "," : "") << "{\"name\":" << json_string(f.tiers[i].name)
      << ",\"quota\":" << jnum(f.tiers[i].quota) << ",\"used\":" << jnum(f.tiers[i].used)
      << ",\"full\":" << (f.tiers[i].full ? "true" : "false") << "}";
  o << "],\"used_monarch\":" << (f.used_monarch ? "true" : "false")
    << ",\"attached\":{\"processes\":" << (f.attached < 0 ? "null" : jnum(f.attached))
    << ",\"first_pid\":" << jnum(f.first_pid)
    << ",\"first_command\":" << json_string(f.first_command)
    << ",\"first_s\":" << jnum(f.first_attached_s) << "}";
  o << ",\"total\":" << traffic_json(f.total) << ",\"epochs\":[";
  for (size_t i = 0; i < f.epochs.size(); ++i) {
    const EpochFigures& e = f.epochs[i];
    o << (i ? "," : "") << "{\"number\":" << e.number
      << ",\"complete\":" << (e.complete ? "true" : "false")
      << ",\"steady\":" << (e.steady ? "true" : "false") << ",\"start_s\":" << jnum(e.start_s)
      << ",\"seconds\":" << jnum(e.seconds) << ",\"rate\":" << jnum(e.rate())
      << ",\"traffic\":" << traffic_json(e.traffic) << "}";
  }
  o << "],\"fallbacks\":[";
  for (size_t i = 0; i < f.fallbacks.size(); ++i)
    o << (i ? "," : "") << "{\"counter\":" << json_string(f.fallbacks[i].counter)
      << ",\"count\":" << jnum(f.fallbacks[i].count)
      << ",\"text\":" << json_string(f.fallbacks[i].text) << "}";
  o << "],\"verdict\":{\"bound\":" << json_string(v.bound)
    << ",\"reason\":" << json_string(v.reason) << ",\"S\":" << jnum(v.S) << ",\"h\":" << jnum(v.h)
    << ",\"B1\":" << jnum(v.B1) << ",\"B2\":" << jnum(v.B2)
    << ",\"B2_source\":" << json_string(v.B2_source) << ",\"C\":" << jnum(v.C)
    << ",\"C_source\":" << json_string(v.C_source) << ",\"C_epochs\":[";
  for (size_t i = 0; i < v.C_epochs.size(); ++i) o << (i ? "," : "") << v.C_epochs[i];
  o << "],\"h_needed\":" << (v.h_needed < 0 ? "null" : jnum(v.h_needed))
    << ",\"capacity_needed\":" << (v.h_needed < 0 ? "null" : jnum(v.capacity_needed))
    << ",\"quota\":" << jnum(v.quota)
    << ",\"b_ratio\":" << (v.B1 > 0 && v.B2 > 0 ? jnum(v.B1 / v.B2) : "null")
    << ",\"c_ratio\":" << jfrac(v.quota, v.S) << ",\"first_epoch\":" << json_string(v.first_epoch)
    << "}";
  o << ",\"stats\":" << p.raw << "}\n";
  return o.str();
}

std::string explain_text() {
  std::ostringstream o;
  o << "Counters of the statistics (\"totals\", and \"counters\" of each epoch):\n";
  for (size_t i = 0; i < kNumProcessCounters; ++i) {
    const CounterInfo& c = kProcessCounters[i];
    o << "  " << c.name << ": " << c.meaning << (c.count > 1 ? " (a list: one per tier)" : "")
      << "\n";
  }
  o << "The stager's (\"stager\" inside them):\n";
  for (int i = 0; i < kNumStagerCounters; ++i)
    o << "  stager." << kStagerCounters[i].name << ": " << kStagerCounters[i].meaning << "\n";
  return o.str();
}

}  // namespace monarch
