#include "report.h"

#include <fcntl.h>
#include <unistd.h>

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "config.h"
#include "stats.h"

namespace monarch {
namespace pt = boost::property_tree;

namespace {}  // namespace

// The value of "stats" in a report is written last, so it runs to the final brace.
std::string stats_of(const std::string& json) {
  if (json.find(std::string("\"schema\":\"") + kReportSchema + "\"") == std::string::npos)
    return json;
  size_t at = json.find("\"stats\":");
  size_t end = json.find_last_of('}');
  if (at == std::string::npos || end == std::string::npos || end <= at)
    throw ReportError("a report without its statistics");
  return json.substr(at + 8, end - at - 8);
}

namespace {

pt::ptree parse(const std::string& json) {
  pt::ptree t;
  try {
    std::istringstream in(stats_of(json));
    pt::read_json(in, t);
  } catch (const pt::json_parser_error& e) {
    throw ReportError("not valid JSON (" + e.message() + " at line " + std::to_string(e.line()) +
                      "): truncated, or not Monarch's");
  }
  if (t.get<std::string>("schema", "") != kStatsSchema)
    throw ReportError(std::string("not Monarch statistics (no \"schema\": \"") + kStatsSchema +
                      "\")");
  if (!t.get_child_optional("totals") || !t.get_child_optional("index"))
    throw ReportError("Monarch statistics without totals or index: truncated");
  return t;
}

double num(const pt::ptree& t, const std::string& key) {
  return t.get<double>(key, 0);
}

double sum(const pt::ptree& t, const std::string& key) {
  auto c = t.get_child_optional(key);
  if (!c) return 0;
  if (c->empty()) return c->get_value<double>(0);
  double s = 0;
  for (auto& kv : *c) s += kv.second.get_value<double>(0);
  return s;
}

Traffic traffic(const pt::ptree& c) {
  Traffic t;
  t.opens = num(c, "opens");
  t.reads = num(c, "reads");
  t.bytes = num(c, "bytes");
  t.pfs_opens = num(c, "pfs_opens") + num(c, "stager.pfs_opens");
  t.pfs_reads = num(c, "pfs_reads") + num(c, "stager.pfs_reads");
  t.pfs_bytes = num(c, "pfs_bytes") + num(c, "stager.pfs_bytes");
  t.local_bytes = sum(c, "tier_bytes");
  return t;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string pct(double part, double whole) {
  return whole > 0 ? fmt("%.1f%%", 100 * part / whole) : "-";
}
std::string rate(double bytes_per_s) {
  return human_bytes(bytes_per_s) + "/s";
}
std::string count(double v) {
  return fmt("%.0f", v);
}

// Plain words for every fallback and limit the counters show.
std::vector<std::string> fallbacks(const pt::ptree& t, const Figures& f) {
  std::vector<std::string> out;
  const pt::ptree& c = t.get_child("totals");
  auto add = [&](double n, const std::string& text) {
    if (n > 0) out.push_back(count(n) + " " + text);
  };
  if (!f.complete)
    out.push_back(
        "the statistics are incomplete: the stager did not stop normally (killed?); "
        "they end at its last flush");
  add(num(c, "fb_no_stager"), "times a process found no stager running and read from the PFS");
  add(num(c, "fb_stale"), "opens found the PFS file changed since indexing: read from the PFS");
  add(num(c, "fb_wait"), "reads did not wait for a copy that made no progress: read from the PFS");
  add(num(c, "fb_error"), "local copies could not be opened: read from the PFS");
  std::string full;
  for (const Figures::Tier& tier : f.tiers)
    full += (full.empty() ? "" : ", ") + tier.name + " " + human_bytes(tier.used) + " of " +
            human_bytes(tier.quota) + (tier.full ? " (file system full)" : "");
  add(num(c, "stager.noroom"), "files did not fit on any tier (" + full + ")");
  add(num(c, "stager.copy_errors"), "copies failed with an I/O error: read from the PFS");
  add(num(c, "stager.stale"), "files had changed on the PFS: not copied, or their copy dropped");
  add(num(c, "stager.tier_full"),
      "times a tier's file system ran out of space (another job may have filled it)");
  add(num(c, "stager.discarded"), "copies from an earlier stager no longer matched the PFS");
  return out;
}

Verdict verdict(const pt::ptree& t, const Figures& f) {
  Verdict v;
  const pt::ptree& c = t.get_child("totals");
  v.S = f.dataset_bytes;
  v.h = v.S > 0 ? f.cached_bytes / v.S : 0;
  for (const Figures::Tier& tier : f.tiers) v.quota += tier.quota;
  double ls_ns = num(c, "local_sample_ns");
  if (ls_ns > 0) v.B1 = num(c, "local_sample_bytes") / ls_ns * 1e9;
  double copy_bytes = num(c, "stager.pfs_bytes"), copy_ns = num(c, "stager.pfs_read_ns");
  unsigned threads = t.get<unsigned>("settings.copy_threads", 1);
  if (copy_bytes > 0 && f.fill_seconds > 0)
    v.B2 = copy_bytes / f.fill_seconds;
  else if (copy_ns > 0)
    v.B2 = copy_bytes / (copy_ns / 1e9 / std::max(1u, threads));
  std::vector<double> cached_rates;
  for (const EpochFigures& e : f.epochs)
    if (e.complete && e.seconds > 0 && e.traffic.hit() >= 0.99)
      cached_rates.push_back(e.traffic.bytes / e.seconds);
  if (!cached_rates.empty()) {
    std::sort(cached_rates.begin(), cached_rates.end());
    v.C = cached_rates[cached_rates.size() / 2];
  }
  if (v.C <= 0) {
    v.bound = "undecided";
    v.reason =
        "no complete epoch was read from node-local tiers, so the job's own rate is "
        "unknown: run at least two epochs with tiers that hold the dataset";
    return v;
  }
  if (v.B2 <= 0) {
    v.bound = "undecided";
    v.reason = "the stager read nothing from the PFS, so its rate is unknown";
    return v;
  }
  v.h_needed = std::max(0.0, 1 - v.B2 / v.C);
  v.capacity_needed = v.h_needed * v.S;
  std::string rates = "fully cached epochs consumed " + rate(v.C) + " (C); the PFS delivered " +
                      rate(v.B2) + " (B2)";
  if (v.B1 > 0 && v.C >= 0.8 * v.B1) {
    v.bound = "local tier";
    v.reason = rates + "; one reader reads the local tier at " + rate(v.B1) +
               " (B1): the job consumes data about as fast as the local tier gives it";
  } else if (v.h + 0.01 >= v.h_needed) {
    v.bound = "compute";
    v.reason = rates + ": with " + pct(v.h, 1) +
               " of the dataset cached (needed: " + pct(v.h_needed, 1) +
               "), I/O keeps up and the job is bound by its computation";
  } else {
    v.bound = "pfs";
    v.reason = rates + ": only " + pct(v.h, 1) + " of the dataset is cached, " +
               pct(v.h_needed, 1) + " is needed for the PFS to keep up";
  }
  return v;
}

void write_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && write(fd, text.data(), text.size()) == ssize_t(text.size());
  int err = errno;
  if (fd >= 0 && close(fd) != 0 && ok) ok = false, err = errno;
  if (ok && rename(tmp.c_str(), path.c_str()) == 0) return;
  if (ok) err = errno;
  unlink(tmp.c_str());
  throw std::runtime_error("cannot write " + path + ": " + std::strerror(err));
}

}  // namespace

Figures figures(const std::string& json) {
  pt::ptree t = parse(json);
  Figures f;
  f.job = t.get<std::string>("job", "?");
  f.host = t.get<std::string>("host", "");
  f.user = t.get<std::string>("user", "");
  f.dataset = t.get<std::string>("dataset", "?");
  f.complete = t.get<bool>("complete", false);
  f.elapsed_s = num(t, "elapsed_s");
  f.files = num(t, "index.files");
  f.dataset_bytes = num(t, "index.bytes");
  f.cached_files = num(t, "cached.files");
  f.cached_bytes = num(t, "cached.bytes");
  f.fill_seconds = num(t, "cached.fill_seconds");
  if (auto tiers = t.get_child_optional("tiers"))
    for (auto& kv : *tiers)
      f.tiers.push_back({kv.second.get<std::string>("name", "?"), num(kv.second, "quota"),
                         num(kv.second, "used"), kv.second.get<bool>("full", false)});
  f.total = traffic(t.get_child("totals"));
  if (auto epochs = t.get_child_optional("epochs"))
    for (auto& kv : *epochs) {
      const pt::ptree& e = kv.second;
      EpochFigures ef;
      ef.number = e.get<int>("number", 0);
      ef.complete = e.get<bool>("complete", false);
      ef.start_s = num(e, "start_s");
      ef.seconds = num(e, "end_s") - ef.start_s;
      if (auto c = e.get_child_optional("counters")) ef.traffic = traffic(*c);
      f.epochs.push_back(ef);
    }
  f.fallbacks = fallbacks(t, f);
  f.verdict = verdict(t, f);
  return f;
}

std::string summary_text(const std::string& json) {
  Figures f = figures(json);
  std::ostringstream o;
  const Traffic& t = f.total;
  o << "monarch: job " << f.job << (f.host.empty() ? "" : " on " + f.host) << ", dataset "
    << f.dataset << " (" << count(f.files) << " files, " << human_bytes(f.dataset_bytes) << ")"
    << (f.complete ? "" : " [incomplete]") << "\n";
  o << "  read " << human_bytes(t.bytes) << " in " << count(t.opens) << " opens and "
    << count(t.reads) << " reads; " << pct(t.local_bytes, t.bytes) << " from node-local tiers\n";
  o << "  PFS: " << count(t.pfs_opens) << " opens, " << count(t.pfs_reads) << " reads, "
    << human_bytes(t.pfs_bytes) << " — without Monarch: " << count(t.opens) << ", "
    << count(t.reads) << ", " << human_bytes(t.bytes) << "; avoided "
    << pct(t.opens - t.pfs_opens, t.opens) << " of opens, " << pct(t.reads - t.pfs_reads, t.reads)
    << " of reads, " << pct(t.bytes - t.pfs_bytes, t.bytes) << " of bytes\n";
  for (const EpochFigures& e : f.epochs) {
    const Traffic& x = e.traffic;
    o << "  epoch " << e.number << (e.complete ? "" : " (partial)") << ": "
      << fmt("%.2f", e.seconds) << " s, local " << pct(x.local_bytes, x.bytes) << ", PFS "
      << count(x.pfs_opens) << " opens / " << count(x.pfs_reads) << " reads / "
      << human_bytes(x.pfs_bytes) << " (avoided " << pct(x.bytes - x.pfs_bytes, x.bytes)
      << " of bytes)\n";
  }
  o << "  cached: " << count(f.cached_files) << " files, " << human_bytes(f.cached_bytes) << " ("
    << pct(f.cached_bytes, f.dataset_bytes) << " of the dataset)";
  for (const Figures::Tier& tier : f.tiers)
    o << "; " << tier.name << " " << human_bytes(tier.used) << " of " << human_bytes(tier.quota);
  if (f.fill_seconds > 0) o << "; filled in " << fmt("%.1f", f.fill_seconds) << " s";
  o << "\n";
  for (const std::string& line : f.fallbacks) o << "  note: " << line << "\n";
  const Verdict& v = f.verdict;
  o << "  verdict: " << (v.bound == "undecided" ? "undecided" : v.bound + "-bound") << " — "
    << v.reason << ".";
  if (v.bound == "pfs" || v.bound == "compute")
    o << " Local capacity for a compute-bound job: " << human_bytes(v.capacity_needed) << " ("
      << pct(v.h_needed, 1) << " of the dataset); configured: " << human_bytes(v.quota) << ".";
  o << "\n";
  return o.str();
}

std::string report_json(const std::string& json) {
  Figures f = figures(json);
  std::ostringstream o;
  auto traffic_json = [&](const Traffic& t) {
    o << "{\"opens\":" << t.opens << ",\"reads\":" << t.reads << ",\"bytes\":" << t.bytes
      << ",\"pfs_opens\":" << t.pfs_opens << ",\"pfs_reads\":" << t.pfs_reads
      << ",\"pfs_bytes\":" << t.pfs_bytes << ",\"local_bytes\":" << t.local_bytes
      << ",\"local_hit\":" << t.hit() << ",\"avoided\":{\"opens\":" << t.opens - t.pfs_opens
      << ",\"reads\":" << t.reads - t.pfs_reads << ",\"bytes\":" << t.bytes - t.pfs_bytes << "}}";
  };
  o.precision(15);
  o << "{\"schema\":" << json_string(kReportSchema) << ",\"job\":" << json_string(f.job)
    << ",\"host\":" << json_string(f.host) << ",\"user\":" << json_string(f.user)
    << ",\"dataset\":" << json_string(f.dataset)
    << ",\"complete\":" << (f.complete ? "true" : "false") << ",\"elapsed_s\":" << f.elapsed_s
    << ",\"dataset_files\":" << f.files << ",\"dataset_bytes\":" << f.dataset_bytes
    << ",\"cached\":{\"files\":" << f.cached_files << ",\"bytes\":" << f.cached_bytes
    << ",\"fraction\":" << (f.dataset_bytes > 0 ? f.cached_bytes / f.dataset_bytes : 0)
    << ",\"fill_seconds\":" << f.fill_seconds << "},\"total\":";
  traffic_json(f.total);
  o << ",\"epochs\":[";
  for (size_t i = 0; i < f.epochs.size(); ++i) {
    const EpochFigures& e = f.epochs[i];
    o << (i ? "," : "") << "{\"number\":" << e.number
      << ",\"complete\":" << (e.complete ? "true" : "false") << ",\"start_s\":" << e.start_s
      << ",\"seconds\":" << e.seconds << ",\"traffic\":";
    traffic_json(e.traffic);
    o << "}";
  }
  o << "],\"fallbacks\":[";
  for (size_t i = 0; i < f.fallbacks.size(); ++i)
    o << (i ? "," : "") << json_string(f.fallbacks[i]);
  const Verdict& v = f.verdict;
  o << "],\"verdict\":{\"bound\":" << json_string(v.bound)
    << ",\"reason\":" << json_string(v.reason) << ",\"S\":" << v.S << ",\"h\":" << v.h
    << ",\"B1\":" << v.B1 << ",\"B2\":" << v.B2 << ",\"C\":" << v.C
    << ",\"h_needed\":" << v.h_needed << ",\"capacity_needed\":" << v.capacity_needed
    << ",\"quota\":" << v.quota << "}";
  std::string stats = stats_of(json);
  while (!stats.empty() && std::isspace(static_cast<unsigned char>(stats.back()))) stats.pop_back();
  o << ",\"stats\":" << stats << "}\n";  // last: stats_of() finds it there
  return o.str();
}

std::vector<std::string> write_reports(const std::string& json, const std::string& dir) {
  Figures f = figures(json);
  if (!valid_job_key(f.job)) throw ReportError("a job key that cannot name a file: " + f.job);
  std::string base = dir + "/monarch-" + f.job;
  std::vector<std::string> paths = {base + ".txt", base + ".json", base + ".svg"};
  write_atomically(paths[0], summary_text(json));
  write_atomically(paths[1], report_json(json));
  write_atomically(paths[2], report_svg(json));
  return paths;
}

}  // namespace monarch
