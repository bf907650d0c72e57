// Parsing the statistics and deriving the report's figures: traffic avoided,
// fallbacks in words, the roofline verdict (defined in report.h).
#include "report.h"
#include "shown.h"

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "config.h"
#include "counters.h"
#include "report_internal.h"
#include "stats.h"

namespace monarch {
namespace pt = boost::property_tree;

namespace report_internal {

const CounterInfo kProcessCounters[] = {
#define MONARCH_REPORT_PROCESS(name, n, meaning) {c_##name, #name, n, meaning},
    MONARCH_PROCESS_COUNTERS(MONARCH_REPORT_PROCESS)
#undef MONARCH_REPORT_PROCESS
};
const CounterInfo kStagerCounters[] = {
#define MONARCH_REPORT_STAGER(name, meaning) {s_##name, #name, 1, meaning},
    MONARCH_STAGER_COUNTERS(MONARCH_REPORT_STAGER)
#undef MONARCH_REPORT_STAGER
};
const size_t kNumProcessCounters = std::size(kProcessCounters);

std::string pkey(int id) {
  for (const CounterInfo& c : kProcessCounters)
    if (c.id == id) return c.name;
  return "";
}
std::string skey(int id) {
  return std::string("stager.") + kStagerCounters[id].name;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}
std::string pct(double part, double whole) {
  // A share: of what the caller measured, never outside 0-100% (rounding of
  // interpolated counters aside, none should be; callers say "more" apart).
  return whole > 0 ? fmt("%.1f%%", 100 * std::clamp(part / whole, 0.0, 1.0)) : "-";
}
std::string rate(double bytes_per_s) {
  return bytes_per_s > 0 ? human_bytes(bytes_per_s) + "/s" : "unknown";
}
std::string count(double v) {
  return fmt("%.0f", v);
}

// Where a JSON value that starts at s[i] ends. The text already parsed, so
// only strings need care.
size_t skip_value(const std::string& s, size_t i) {
  int depth = 0;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '"') {
      for (++i; i < s.size() && s[i] != '"'; ++i)
        if (s[i] == '\\') ++i;
      if (depth == 0) return i + 1;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth <= 0) return i + (depth == 0 ? 1 : 0);
    } else if (depth == 0 && (c == ',' || std::isspace(static_cast<unsigned char>(c)))) {
      return i;
    }
  }
  return i;
}

// The text of the top-level member `key` of the JSON object in `s`, "" if none.
std::string member_text(const std::string& s, const std::string& key) {
  auto ws = [&](size_t i) {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
    return i;
  };
  size_t i = ws(0);
  if (i >= s.size() || s[i] != '{') return "";
  for (i = ws(i + 1); i < s.size() && s[i] == '"';) {
    size_t end = skip_value(s, i);
    bool match = s.compare(i + 1, end - i - 2, key) == 0 && end - i - 2 == key.size();
    i = ws(end);
    if (i >= s.size() || s[i] != ':') return "";
    size_t v = ws(i + 1), vend = skip_value(s, v);
    if (match) return s.substr(v, vend - v);
    i = ws(vend);
    if (i < s.size() && s[i] == ',') i = ws(i + 1);
  }
  return "";
}

// How deeply `s` nests arrays and objects (outside strings). Monarch's
// statistics nest 5 deep; the JSON parser recurses, so a hostile file of a
// million brackets must not reach it.
int nesting(const std::string& s) {
  int depth = 0, deepest = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '"')
      for (++i; i < s.size() && s[i] != '"'; ++i) i += s[i] == '\\';
    else if (s[i] == '{' || s[i] == '[')
      deepest = std::max(deepest, ++depth);
    else if (s[i] == '}' || s[i] == ']')
      --depth;
  }
  return deepest;
}

Parsed parse(const std::string& json) {
  if (json.find_first_not_of(" \t\r\n") == std::string::npos)
    throw ReportError("not valid JSON: the file is empty");
  if (nesting(json) > 32) throw ReportError("JSON nested too deeply: not Monarch's");
  Parsed p;
  pt::ptree doc;
  try {
    std::istringstream in(json);
    pt::read_json(in, doc);
  } catch (const pt::json_parser_error& e) {
    throw ReportError("not valid JSON (" + e.message() + " at line " + std::to_string(e.line()) +
                      "): truncated, or not Monarch's");
  }
  std::string schema = doc.get<std::string>("schema", "");
  if (schema == kReportSchema) {
    auto stats = doc.get_child_optional("stats");
    p.raw = member_text(json, "stats");
    if (!stats || p.raw.empty()) throw ReportError("a Monarch report without its statistics");
    p.stats = *stats;
    schema = p.stats.get<std::string>("schema", "");
  } else {
    p.stats = std::move(doc);
    p.raw = json;
  }
  if (schema != kStatsSchema && schema != kStatsSchemaV1) {
    bool ours = schema.rfind("monarch-stats/", 0) == 0 || schema.rfind("monarch-report/", 0) == 0;
    if (ours)
      throw ReportError("schema \"" + schema + "\" is from another version of Monarch; this " +
                        "monarch-report reads " + kStatsSchemaV1 + ", " + kStatsSchema + " and " +
                        kReportSchema);
    throw ReportError(std::string("not Monarch statistics (no \"schema\": \"") + kStatsSchema +
                      "\")");
  }
  if (!p.stats.get_child_optional("totals") || !p.stats.get_child_optional("index"))
    throw ReportError("Monarch statistics without totals or index: truncated");
  while (!p.raw.empty() && std::isspace(static_cast<unsigned char>(p.raw.back()))) p.raw.pop_back();
  return p;
}

}  // namespace report_internal

using namespace report_internal;

namespace {

double num(const pt::ptree& t, const std::string& key) {
  return t.get<double>(key, 0);
}

// A counter that is one number, or one per tier (summed).
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
  t.opens = num(c, pkey(c_opens));
  t.reads = num(c, pkey(c_reads));
  t.bytes = num(c, pkey(c_bytes));
  t.job_pfs_opens = num(c, pkey(c_pfs_opens));
  t.job_pfs_reads = num(c, pkey(c_pfs_reads));
  t.job_pfs_bytes = num(c, pkey(c_pfs_bytes));
  t.job_pfs_read_ns = num(c, pkey(c_pfs_read_ns));
  t.stager_pfs_bytes = num(c, skey(s_pfs_bytes));
  t.pfs_opens = t.job_pfs_opens + num(c, skey(s_pfs_opens));
  t.pfs_reads = t.job_pfs_reads + num(c, skey(s_pfs_reads));
  t.pfs_bytes = t.job_pfs_bytes + t.stager_pfs_bytes + num(c, skey(s_check_bytes));
  t.stager_copied = t.stager_pfs_bytes + num(c, skey(s_handoff_bytes));
  t.local_reads = sum(c, pkey(c_tier_reads));
  t.local_bytes = sum(c, pkey(c_tier_bytes));
  t.mmaps = num(c, pkey(c_mmaps));
  t.mmap_bytes = num(c, pkey(c_mmap_bytes));
  t.mmap_local = num(c, pkey(c_mmap_local));
  t.mmap_local_bytes = num(c, pkey(c_mmap_local_bytes));
  t.peer_sent = num(c, skey(s_served_bytes));
  t.peer_received = num(c, skey(s_peer_bytes));
  t.peers_failed = num(c, skey(s_peers_failed));
  t.alone = num(c, skey(s_alone));
  t.index_source = num(c, skey(s_index_source));
  t.index_in = num(c, skey(s_index_bytes_in));
  t.index_out = num(c, skey(s_index_bytes_out));
  t.index_ms = num(c, skey(s_index_ms));
  t.peak_memory = num(c, skey(s_peak_memory));
  return t;
}

// The error of a failed copy in words: " (last error: ENOSPC, No space left
// on device)", or "" when no errno was kept.
std::string errno_words(int err) {
  if (err <= 0 || err > 4095) return "";
  const char* name = strerrorname_np(err);
  return std::string(" (last error: ") + (name ? name : "errno " + std::to_string(err)) + ", " +
         std::strerror(err) + ")";
}

// Plain words for the counters that mean "read from the PFS after all" or
// "could not cache": each counter's own sentence, else its meaning from
// counters.h (so a new fb_* counter is never silently left out).
std::vector<Fallback> fallbacks(const pt::ptree& t, const Figures& f) {
  std::vector<Fallback> out;
  const pt::ptree& c = t.get_child("totals");
  auto add = [&](const std::string& key, double n, const std::string& text) {
    if (n > 0) out.push_back({key, n, count(n) + " " + text});
  };
  if (!f.used_monarch)
    out.push_back({"attached.processes", 0,
                   std::string("no process of the job used Monarch: none loaded the job map, so "
                               "the job's reads went to the PFS unseen and none is counted here; "
                               "likely causes: ") +
                       kUnusedCauses});
  for (size_t i = 0; i < kNumProcessCounters; ++i) {
    const CounterInfo& k = kProcessCounters[i];
    if (std::string(k.name).rfind("fb_", 0) != 0) continue;
    std::string text =
        k.id == c_fb_no_stager ? "times a process found no stager running and read from the PFS"
        : k.id == c_fb_stale ? "opens found the PFS file changed since indexing: read from the PFS"
        : k.id == c_fb_wait
            ? "reads did not wait for a copy that made no progress: read from the PFS"
        : k.id == c_fb_error ? "local copies could not be opened or read: read from the PFS"
                             : k.meaning;
    add(k.name, num(c, k.name), text);
  }
  std::string tiers;
  for (const Figures::Tier& tier : f.tiers)
    tiers += (tiers.empty() ? "" : ", ") + tier.name + " " + human_bytes(tier.used) + " of " +
             human_bytes(tier.quota) + (tier.full ? ", its file system full" : "");
  if (num(c, skey(s_alone)) > 0)
    out.push_back({skey(s_alone), 1,
                   "this node cached on its own, outside the job's cache (the stager's log says "
                   "why): it walked the dataset and copied its files from the PFS itself"});
  add(skey(s_noroom), num(c, skey(s_noroom)),
      "files did not fit on any tier (" + tiers + "): read from the PFS in every epoch");
  double denied = num(c, skey(s_copy_denied)), other = num(c, skey(s_copy_errors)) - denied;
  add(skey(s_copy_denied), denied,
      "copies failed: permission denied (EACCES) reading the PFS file: read from the PFS");
  add(skey(s_copy_errors), other,
      "copies failed" + errno_words(int(num(c, skey(s_copy_errno)))) + ": read from the PFS");
  add(skey(s_stale), num(c, skey(s_stale)),
      "files had changed on the PFS since indexing: not copied, or their copy dropped");
  add(skey(s_tier_full), num(c, skey(s_tier_full)),
      "times a tier's file system ran out of space before its quota (another job may have "
      "filled it)");
  add(skey(s_discarded), num(c, skey(s_discarded)),
      "copies left by an earlier stager of this job no longer matched the PFS: copied again");
  add("index.skipped", num(t, "index.skipped"),
      "dataset entries are not regular files (links, devices, sockets, FIFOs): always read "
      "from the PFS");
  add("index.unreadable_dirs", num(t, "index.unreadable_dirs"),
      "dataset directories could not be listed: their files are not cached");
  add("index.stopped", num(t, "index.stopped"),
      "walk of the dataset stopped by the job's end: the figures count only the files it had "
      "found");
  return out;
}

// The job as people name it: Slurm's job42 is "job 42", monarch-run's
// run-4711 is "monarch-run 4711"; any other key is "job KEY".
std::string job_title(const std::string& key) {
  auto digits_after = [&](const std::string& prefix) {
    return key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0 &&
           key.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
  };
  if (digits_after("job")) return "job " + key.substr(3);
  if (digits_after("run-")) return "monarch-run " + key.substr(4);
  return "job " + key;
}

// B2 and its source, as report.h defines them.
void pfs_rate(const pt::ptree& t, const Figures& f, Verdict& v) {
  const Traffic& x = f.total;
  double read_ns = num(t, "totals." + skey(s_pfs_read_ns));
  double threads = std::max(1.0, num(t, "settings.copy_threads"));
  if (t.get<bool>("settings.stage_ahead", true) && f.fill_seconds > 0 && x.stager_copied > 0) {
    v.B2 = x.stager_copied / f.fill_seconds;
    v.B2_source = "fill";
  } else if (x.stager_pfs_bytes > 0 && read_ns > 0) {
    v.B2 = x.stager_pfs_bytes / (read_ns / 1e9 / threads);
    v.B2_source = "stager reads";
  } else if (x.job_pfs_bytes > 0 && x.job_pfs_read_ns > 0) {
    v.B2 = x.job_pfs_bytes / (x.job_pfs_read_ns / 1e9);
    v.B2_source = "job reads";
  }
}

std::string b2_words(const Verdict& v) {
  std::string how = v.B2_source == "fill" ? "bytes cached from the PFS over the fill time"
                    : v.B2_source == "stager reads"
                        ? "the stager's reads, its threads assumed busy together: an upper bound"
                        : "the job's own PFS reads, one reader's rate: a lower bound";
  return "the PFS delivered " + rate(v.B2) + " (B2, " + how + ")";
}

// The time all readers together spent in some calls, against the elapsed
// time: a share while that is at most 100%; beyond, readers worked in
// parallel, and the words say how many were in those calls at once.
std::string busy_words(double busy_s, double elapsed_s) {
  double share = elapsed_s > 0 ? busy_s / elapsed_s : 0;
  if (share <= 1) return pct(share, 1) + " of the time";
  return "all the time, " + fmt("%.1f", share) + " readers at once on average";
}

// C and its source, as report.h defines them.
void consumption_rate(const Figures& f, Verdict& v) {
  std::vector<std::pair<double, int>> cached;  // (rate, epoch) of fully local steady epochs
  const EpochFigures* partial = nullptr;       // the last steady epoch that read the PFS
  for (const EpochFigures& e : f.epochs) {
    if (!e.steady || e.seconds <= 0) continue;
    if (e.traffic.hit() >= 0.99)
      cached.push_back({e.rate(), e.number});
    else
      partial = &e;
  }
  if (!cached.empty()) {
    std::sort(cached.begin(), cached.end());
    size_t m = cached.size() / 2;
    v.C = cached.size() % 2 ? cached[m].first : (cached[m - 1].first + cached[m].first) / 2;
    for (auto& [r, n] : cached) v.C_epochs.push_back(n);
    std::sort(v.C_epochs.begin(), v.C_epochs.end());
    std::string list;
    for (int n : v.C_epochs) list += (list.empty() ? "" : ", ") + std::to_string(n);
    v.C_source = "cached epochs";
    v.C_words = "fully cached epochs (" + list + ") consumed " + rate(v.C) + " (C)";
    return;
  }
  if (!partial) return;
  v.pfs_wait_epoch = partial->number;
  double wait = partial->traffic.job_pfs_read_ns / 1e9, T = partial->seconds;
  v.pfs_wait_share = wait / T;
  std::string e = "epoch " + std::to_string(partial->number);
  v.C_words = e + " read " + pct(1 - partial->traffic.hit(), 1) + " of its bytes from the PFS; " +
              (wait <= T ? "the job's readers spent " + fmt("%.2f", wait) + " s of its " +
                               fmt("%.2f", T) + " s in PFS reads"
                         : "the job's readers were in PFS reads " + busy_words(wait, T) + " (" +
                               fmt("%.2f", wait) + " s of reads in its " + fmt("%.2f", T) + " s)");
  if (wait >= 0.9 * T) return;
  v.C = partial->traffic.bytes / (T - wait);
  v.C_epochs = {partial->number};
  v.C_source = e + " less its PFS reads";
  v.C_words += ", so with all its data local it would consume about " + rate(v.C) +
               " (C, estimated: exact for readers that wait for each read, too high for "
               "readers that overlap them, which asks for more capacity than needed)";
}

Verdict verdict(const pt::ptree& t, const Figures& f) {
  Verdict v;
  const pt::ptree& c = t.get_child("totals");
  v.S = f.dataset_bytes;
  v.h = v.S > 0 ? std::min(1.0, f.cached_bytes / v.S) : 0;
  for (const Figures::Tier& tier : f.tiers) v.quota += tier.quota;
  double ls_ns = num(c, pkey(c_local_sample_ns));
  if (ls_ns > 0) v.B1 = num(c, pkey(c_local_sample_bytes)) / ls_ns * 1e9;
  pfs_rate(t, f, v);
  consumption_rate(f, v);

  if (const EpochFigures* e1 = f.epochs.empty() ? nullptr : &f.epochs[0];
      e1 && e1->complete && e1->seconds > 0 && v.C > 0 && v.C_source == "cached epochs") {
    double ratio = e1->rate() > 0 ? v.C / e1->rate() : 0;
    v.first_epoch = "epoch 1 (the fill) ran at " + rate(e1->rate()) + ", " + fmt("%.1f", ratio) +
                    "x as long as a fully cached epoch";
    if (v.B2 > 0 && e1->traffic.pfs_bytes / v.B2 >= 0.8 * e1->seconds)
      v.first_epoch += ": bound by the PFS";
  }
  if (v.C > 0 && v.B2 > 0) {
    v.h_needed = std::max(0.0, 1 - v.B2 / v.C);
    v.capacity_needed = v.h_needed * v.S;
  }
  bool measured = v.C_source == "cached epochs";
  if (v.C > 0 && v.B2 > 0 && v.h + 0.01 < v.h_needed) {
    v.bound = "pfs";
    v.reason = v.C_words + "; " + b2_words(v) + ": only " + pct(v.h, 1) +
               " of the dataset is cached, " + pct(v.h_needed, 1) +
               " is needed for the PFS to keep up";
  } else if (v.C > 0 && (v.B2 > 0 || v.h >= 0.99)) {
    double share = v.B1 > 0 ? v.C / v.B1 : 0;
    if (measured && share >= 0.8) {
      v.bound = "local tier";
      v.reason = v.C_words + "; one local read runs at " + rate(v.B1) +
                 " (B1): in those epochs the job's readers were in local reads " +
                 busy_words(share, 1) +
                 ", so the local tier, not the PFS or the computation, sets the pace";
    } else {
      v.bound = "compute";
      v.reason =
          v.C_words + (v.B2 > 0 ? "; " + b2_words(v) : "") + ": with " + pct(v.h, 1) +
          " of the dataset cached (needed: " +
          (v.h_needed >= 0 ? pct(v.h_needed, 1) : std::string("unknown")) +
          "), I/O keeps up and the job is bound by its computation" +
          (measured && v.B1 > 0 ? " (the readers were in local reads " + busy_words(share, 1) + ")"
                                : "");
    }
    if (v.B2 <= 0) v.reason += "; the PFS's rate was not measured (nothing read from it)";
  } else if (v.pfs_wait_epoch > 0) {
    v.bound = "pfs";
    v.reason = v.C_words + ": the PFS sets the pace and more local capacity would help; how " +
               "much cannot be decided (the job's own rate C is unknown without a fully " +
               "cached epoch; at most the whole dataset, " + human_bytes(v.S) + ")";
  } else {
    v.bound = "undecided";
    v.reason = std::string("no steady epoch (") +
               (f.epochs.empty() ? "no epoch completed" : "the stager was copying in every epoch") +
               "), so the job's own rate C is unknown: run at least two epochs with tiers that " +
               "hold the dataset (" + human_bytes(v.S) + ")";
  }
  return v;
}

}  // namespace

std::string stats_of(const std::string& json) {
  return parse(json).raw;
}

Figures figures_of(const pt::ptree& t) {
  Figures f;
  f.job = t.get<std::string>("job", "?");
  f.host = shown(t.get<std::string>("host", ""));
  f.user = shown(t.get<std::string>("user", ""));
  f.dataset = shown(t.get<std::string>("dataset", "?"));
  f.title = shown(job_title(f.job));
  f.complete = t.get<bool>("complete", false);
  f.elapsed_s = num(t, "elapsed_s");
  f.files = num(t, "index.files");
  f.dataset_bytes = num(t, "index.bytes");
  f.cached_files = num(t, "cached.files");
  f.cached_bytes = num(t, "cached.bytes");
  f.fill_seconds = num(t, "cached.fill_seconds");
  if (auto tiers = t.get_child_optional("tiers"))
    for (auto& kv : *tiers)
      f.tiers.push_back({shown(kv.second.get<std::string>("name", "?")), num(kv.second, "quota"),
                         num(kv.second, "used"), kv.second.get<bool>("full", false)});
  f.total = traffic(t.get_child("totals"));
  f.attached = t.get<double>("attached.processes", -1);
  f.first_pid = num(t, "attached.first_pid");
  f.first_attached_s = num(t, "attached.first_s");
  f.first_command = shown(t.get<std::string>("attached.first_command", ""));
  f.used_monarch =
      f.attached != 0 || f.total.opens > 0 || f.total.reads > 0 ||
      num(t, "totals." + pkey(c_stat_index)) + num(t, "totals." + pkey(c_stat_pfs)) > 0;
  if (auto epochs = t.get_child_optional("epochs"))
    for (auto& kv : *epochs) {
      const pt::ptree& e = kv.second;
      EpochFigures ef;
      ef.number = e.get<int>("number", 0);
      ef.complete = e.get<bool>("complete", false);
      ef.start_s = num(e, "start_s");
      ef.seconds = num(e, "end_s") - ef.start_s;
      if (auto c = e.get_child_optional("counters")) ef.traffic = traffic(*c);
      ef.steady = ef.complete && ef.traffic.stager_pfs_bytes <= 0.01 * ef.traffic.bytes;
      f.epochs.push_back(ef);
    }
  f.fallbacks = fallbacks(t, f);
  f.verdict = verdict(t, f);
  return f;
}

Figures figures(const std::string& json) {
  Parsed p = parse(json);
  try {
    return figures_of(p.stats);
  } catch (const pt::ptree_error& e) {
    throw ReportError(std::string("malformed Monarch statistics: ") + e.what());
  }
}

}  // namespace monarch
