// The report's derived figures from hand-written statistics, checked against
// numbers worked out by hand (in the comments): traffic avoided per epoch,
// hit ratios, the verdict's rates and bound, fallbacks, the report JSON, the
// picture's last partial interval, and write_reports.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "counters.h"
#include "report.h"
#include "text_width.h"

namespace monarch {
namespace {
namespace pt = boost::property_tree;

using Values = std::map<std::string, double>;

// A counters object: process counters, tier_* as one-tier lists, "stager".
std::string counters(const Values& job, const Values& stager) {
  std::string s = "{";
  for (auto& [k, v] : job) {
    bool list = k.rfind("tier_", 0) == 0;
    s += "\"" + k + "\":" + (list ? "[" : "") + std::to_string(uint64_t(v)) + (list ? "]," : ",");
  }
  s += "\"stager\":{";
  for (auto& [k, v] : stager) s += "\"" + k + "\":" + std::to_string(uint64_t(v)) + ",";
  if (s.back() == ',') s.pop_back();
  return s + "}}";
}

struct Epoch {
  double start, end;
  Values job, stager;
};

// S = 1,000,000 bytes in 100 files, one tier "ssd" with a 2,000,000 quota.
// Epoch 1 (0-10 s): 400,000 bytes from the tier, 600,000 from the PFS by the
// job; the stager copied 900,000 and wrote 100,000 handed off. Epochs 2
// (10-12 s) and 3 (12-14.5 s): all local.
struct Job {
  double cached = 1e6, fill = 8, quota = 2e6;
  bool complete = true, stage_ahead = true;
  std::vector<Epoch> epochs = {
      {0,
       10,
       {{"opens", 100},
        {"reads", 200},
        {"bytes", 1e6},
        {"tier_reads", 80},
        {"tier_bytes", 4e5},
        {"pfs_opens", 60},
        {"pfs_reads", 120},
        {"pfs_bytes", 6e5},
        {"pfs_read_ns", 6e9}},
       {{"pfs_opens", 100},
        {"pfs_reads", 150},
        {"pfs_bytes", 9e5},
        {"pfs_read_ns", 36e8},
        {"handoff_bytes", 1e5}}},
      {10,
       12,
       {{"opens", 100}, {"reads", 200}, {"bytes", 1e6}, {"tier_reads", 200}, {"tier_bytes", 1e6}},
       {}},
      {12,
       14.5,
       {{"opens", 100}, {"reads", 200}, {"bytes", 1e6}, {"tier_reads", 200}, {"tier_bytes", 1e6}},
       {}}};
  Values extra_totals = {{"local_sample_bytes", 1e6}, {"local_sample_ns", 1e8}};
  Values extra_stager;
  std::string host = "n1", job = "job42";
  double elapsed = 14.5;
  // The processes that loaded the job map (-1: statistics without the count)
  // and when the first did, in seconds.
  double attached = 3, first_s = 0.2;
  // 14 one-second samples (of the tier) sum to 2,000,000 of its 2,400,000
  // bytes: the last 0.5 s holds the other 400,000.
  std::string series =
      "\"series\":{\"interval_s\":1,\"served\":[{\"name\":\"ssd\",\"kind\":\"tier\",\"bytes\":["
      "40000,40000,40000,40000,40000,40000,40000,40000,40000,40000,400000,400000,400000,"
      "400000]},{\"name\":\"pfs\",\"kind\":\"pfs\",\"bytes\":[60000,60000,60000,60000,60000,"
      "60000,60000,60000,60000,60000,0,0,0,0]},{\"name\":\"stager\",\"kind\":\"copy\","
      "\"bytes\":[112500,112500,112500,112500,112500,112500,112500,112500,0,0,0,0,0,0]}],"
      "\"cached\":[{\"name\":\"ssd\",\"kind\":\"tier\",\"bytes\":[125000,250000,375000,500000,"
      "625000,750000,875000,1000000,1000000,1000000,1000000,1000000,1000000,1000000]}]}";

  std::string json() const {
    Values tj = extra_totals, ts = extra_stager;
    for (const Epoch& e : epochs) {
      for (auto& [k, v] : e.job) tj[k] += v;
      for (auto& [k, v] : e.stager) ts[k] += v;
    }
    std::ostringstream o;
    o << "{\"schema\":\"monarch-stats/2\",\"complete\":" << (complete ? "true" : "false")
      << ",\"job\":\"" << job << "\",\"host\":\"" << host
      << "\",\"user\":\"u\",\"dataset\":\"/pfs/d\","
      << "\"elapsed_s\":" << elapsed
      << ",\"settings\":{\"copy_threads\":4,\"stage_ahead\":" << (stage_ahead ? "true" : "false")
      << "},\"tiers\":[{\"name\":\"ssd\",\"dir\":\"/t\","
      << "\"quota\":" << uint64_t(quota) << ",\"used\":" << uint64_t(cached)
      << ",\"full\":false}],\"index\":{\"files\":100,\"bytes\":1000000},\"cached\":{\"files\":"
      << uint64_t(cached / 1e4) << ",\"bytes\":" << uint64_t(cached) << ",\"fill_seconds\":" << fill
      << "},";
    if (attached >= 0)
      o << "\"attached\":{\"processes\":" << attached
        << ",\"first_pid\":" << (attached > 0 ? 4242 : 0) << ",\"first_command\":\""
        << (attached > 0 ? "python3" : "") << "\",\"first_s\":" << first_s << "},";
    o << "\"totals\":" << counters(tj, ts) << ",\"epochs\":[";
    for (size_t i = 0; i < epochs.size(); ++i)
      o << (i ? "," : "") << "{\"number\":" << i + 1
        << ",\"complete\":true,\"start_s\":" << epochs[i].start << ",\"end_s\":" << epochs[i].end
        << ",\"counters\":" << counters(epochs[i].job, epochs[i].stager) << "}";
    o << "]," << series << "}";
    return o.str();
  }
};

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ReportFigures, TrafficAvoidedTotalAndPerEpoch) {
  Figures f = figures(Job().json());
  // Without Monarch 300 opens, 600 reads, 3,000,000 bytes; with it the job's
  // 60/120/600,000 plus the stager's 100/150/900,000.
  EXPECT_DOUBLE_EQ(f.total.opens, 300);
  EXPECT_DOUBLE_EQ(f.total.pfs_opens, 160);
  EXPECT_DOUBLE_EQ(f.total.pfs_reads, 270);
  EXPECT_DOUBLE_EQ(f.total.pfs_bytes, 1.5e6);
  EXPECT_DOUBLE_EQ(f.total.hit(), 0.8);  // 2,400,000 of 3,000,000
  EXPECT_DOUBLE_EQ(f.total.read_hit(), 480.0 / 600);
  ASSERT_EQ(f.epochs.size(), 3u);
  EXPECT_FALSE(f.epochs[0].steady);  // the stager copied in it
  EXPECT_TRUE(f.epochs[1].steady);
  EXPECT_DOUBLE_EQ(f.epochs[0].traffic.hit(), 0.4);
  EXPECT_DOUBLE_EQ(f.epochs[2].seconds, 2.5);
  std::string text = summary_text(Job().json());
  EXPECT_TRUE(has(text,
                  "PFS traffic avoided: 50.0% of bytes (1.4 MiB), 46.7% of opens (140), 55.0% "
                  "of reads (330)"))
      << text;
  // Pass 1: the PFS saw 160 opens for the job's 100: the stager copied
  // ahead. No share below 0%: how much more.
  EXPECT_TRUE(has(text,
                  "avoided none of bytes (488.3 KiB more than without Monarch: copies ahead), "
                  "none of opens (60 more than without Monarch: copies ahead), none of reads (70 "
                  "more than without Monarch: copies ahead)"))
      << text;
  EXPECT_FALSE(std::regex_search(text, std::regex("-[0-9.]+%"))) << text;
  EXPECT_TRUE(has(text, "pass 2: 2.00 s, local 100.0%, 488.3 KiB/s; PFS 0 opens")) << text;
  EXPECT_TRUE(has(text,
                  "PFS with Monarch: 160 opens, 270 reads, 1.4 MiB (the job 60, 120, "
                  "585.9 KiB; the stager's copies 100, 150, 878.9 KiB)"))
      << text;
}

TEST(ReportFigures, ComputeBoundByTheRoofline) {
  Verdict v = figures(Job().json()).verdict;
  EXPECT_EQ(v.B2_source, "fill");
  EXPECT_DOUBLE_EQ(v.B2, 125000);  // (900,000 + 100,000) / 8 s
  EXPECT_DOUBLE_EQ(v.C, 450000);   // median of 500,000 and 400,000
  EXPECT_DOUBLE_EQ(v.B1, 1e7);     // 1,000,000 bytes in 0.1 s
  EXPECT_NEAR(v.h_needed, 1 - 125000.0 / 450000, 1e-12);
  EXPECT_NEAR(v.capacity_needed, 1e6 * (1 - 125000.0 / 450000), 1e-6);
  EXPECT_EQ(v.bound, "compute");
  EXPECT_EQ(v.C_epochs, (std::vector<int>{2, 3}));
  EXPECT_DOUBLE_EQ(v.quota, 2e6);
  // Epoch 1 ran at 100,000 B/s, 4.5x slower; its 1,500,000 PFS bytes take 12 s at B2.
  EXPECT_EQ(v.first_epoch,
            "epoch 1 (the fill) ran at 97.7 KiB/s, 4.5x as long as a fully cached epoch: bound by "
            "the PFS");
  std::string text = summary_text(Job().json());
  EXPECT_TRUE(has(text, "h* = max(0, 1 - B2/C) = 72.2%")) << text;
  EXPECT_TRUE(has(text,
                  "local capacity for a compute-bound job: 705.3 KiB (72.2% of the "
                  "dataset); configured: 1.9 MiB (enough)"))
      << text;
  Job small;
  small.quota = 5e5;
  EXPECT_TRUE(has(summary_text(small.json()), "(short by 217.0 KiB)"));
}

TEST(ReportFigures, LocalTierBound) {
  Job j;
  j.extra_totals = {{"local_sample_bytes", 5e5}, {"local_sample_ns", 1e9}};  // B1 = 500,000
  Verdict v = figures(j.json()).verdict;
  EXPECT_EQ(v.bound, "local tier");  // C/B1 = 0.9
  EXPECT_TRUE(has(v.reason, "were in local reads 90.0% of the time")) << v.reason;
}

TEST(ReportFigures, PfsBoundWhenTooLittleIsCached) {
  Job j;
  j.fill = 40;  // B2 = 25,000: h* = 1 - 25,000/450,000 = 94.4%
  j.cached = 5e5;
  Verdict v = figures(j.json()).verdict;
  EXPECT_EQ(v.bound, "pfs");
  EXPECT_TRUE(has(v.reason, "only 50.0% of the dataset is cached, 94.4% is needed")) << v.reason;
}

// Half the dataset fits: no fully cached epoch. Epochs 2 and 3 read half
// their bytes from the PFS, waiting `wait` s of their `seconds` for it.
Job half(double seconds, double wait) {
  Job j;
  j.cached = 5e5;
  for (int e = 1; e < 3; ++e)
    j.epochs[e] = {j.epochs[e - 1].end,
                   j.epochs[e - 1].end + seconds,
                   {{"opens", 100},
                    {"reads", 200},
                    {"bytes", 1e6},
                    {"tier_reads", 100},
                    {"tier_bytes", 5e5},
                    {"pfs_opens", 50},
                    {"pfs_reads", 100},
                    {"pfs_bytes", 5e5},
                    {"pfs_read_ns", wait * 1e9}},
                   {}};
  return j;
}

TEST(ReportFigures, WithoutACachedEpochCIsEstimated) {
  // C = 1,000,000 / (4.5 - 4) = 2,000,000; h* = 1 - 125,000 / 2,000,000 = 93.75%.
  Verdict v = figures(half(4.5, 4).json()).verdict;
  EXPECT_EQ(v.C_source, "epoch 3 less its PFS reads");
  EXPECT_DOUBLE_EQ(v.C, 2e6);
  EXPECT_DOUBLE_EQ(v.h_needed, 0.9375);
  EXPECT_DOUBLE_EQ(v.capacity_needed, 937500);
  EXPECT_EQ(v.bound, "pfs");
  EXPECT_TRUE(v.first_epoch.empty());  // no cached epoch to compare it with
  // 20 s epochs waiting 4 s: C = 62,500, below B2: nothing needs caching.
  v = figures(half(20, 4).json()).verdict;
  EXPECT_DOUBLE_EQ(v.h_needed, 0);
  EXPECT_EQ(v.bound, "compute");
}

TEST(ReportFigures, ReadersAlwaysWaitingForThePfs) {
  Verdict v = figures(half(4.5, 4.2).json()).verdict;  // 93% of the time in PFS reads
  EXPECT_EQ(v.bound, "pfs");
  EXPECT_DOUBLE_EQ(v.C, 0);
  EXPECT_LT(v.h_needed, 0);
  EXPECT_TRUE(has(v.reason, "spent 4.20 s of its 4.50 s in PFS reads")) << v.reason;
  EXPECT_TRUE(has(v.reason, "how much cannot be decided")) << v.reason;
  std::string r = report_json(half(4.5, 4.2).json());
  EXPECT_TRUE(has(r, "\"h_needed\":null,\"capacity_needed\":null")) << r;
}

TEST(ReportFigures, UndecidedSaysWhat) {
  Job j;
  j.epochs.resize(1);
  Verdict v = figures(j.json()).verdict;
  EXPECT_EQ(v.bound, "undecided");
  EXPECT_TRUE(has(v.reason, "the job's own rate C is unknown")) << v.reason;
  EXPECT_TRUE(has(summary_text(j.json()), "verdict: undecided - no steady epoch"));
}

TEST(ReportFigures, PfsRateSources) {
  Job j;
  j.stage_ahead = false;  // copies only on request: the fill time is the job's
  Verdict v = figures(j.json()).verdict;
  EXPECT_EQ(v.B2_source, "stager reads");
  EXPECT_DOUBLE_EQ(v.B2, 1e6);  // 900,000 bytes in 3.6 s over 4 threads
  for (Epoch& e : j.epochs) e.stager.clear();
  v = figures(j.json()).verdict;
  EXPECT_EQ(v.B2_source, "job reads");
  EXPECT_DOUBLE_EQ(v.B2, 1e5);  // 600,000 bytes in 6 s
}

TEST(ReportFigures, FallbacksInPlainWords) {
  Job j;
  j.complete = false;
  j.extra_stager = {{"noroom", 12}, {"tier_full", 1}};
  j.extra_totals["fb_wait"] = 3;
  std::string text = summary_text(j.json());
  EXPECT_TRUE(has(text, "[incomplete]"));
  EXPECT_TRUE(has(text, "note: the statistics are incomplete"));
  EXPECT_TRUE(has(text,
                  "note: 12 files did not fit on any tier (ssd 976.6 KiB of 1.9 MiB): read "
                  "from the PFS in every epoch"))
      << text;
  EXPECT_TRUE(has(text, "note: 3 reads did not wait for a copy that made no progress")) << text;
  EXPECT_TRUE(has(text, "note: 1 times a tier's file system ran out of space")) << text;
  // Every fb_* counter of counters.h is told, whatever its name.
#define MONARCH_TEST_FB(name, n, meaning)                                           \
  if (std::string(#name).rfind("fb_", 0) == 0) {                                    \
    Job k;                                                                          \
    k.extra_totals[#name] = 5;                                                      \
    bool found = false;                                                             \
    for (const Fallback& fb : figures(k.json()).fallbacks)                          \
      found |= fb.counter == #name && fb.count == 5 && fb.text.rfind("5 ", 0) == 0; \
    EXPECT_TRUE(found) << #name;                                                    \
  }
  MONARCH_PROCESS_COUNTERS(MONARCH_TEST_FB)
#undef MONARCH_TEST_FB
}

pt::ptree tree(const std::string& json) {
  pt::ptree t;
  std::istringstream in(json);
  pt::read_json(in, t);
  return t;
}

TEST(ReportJson, SchemaKeysAndTheStatisticsEmbedded) {
  std::string stats = Job().json(), r = report_json(stats);
  pt::ptree t = tree(r);
  EXPECT_EQ(t.get<std::string>("schema"), "monarch-report/1");
  for (const char* key : {"job",
                          "host",
                          "user",
                          "dataset",
                          "complete",
                          "elapsed_s",
                          "dataset_files",
                          "dataset_bytes",
                          "cached.fraction",
                          "tiers",
                          "total.avoided.bytes_fraction",
                          "epochs",
                          "fallbacks",
                          "verdict.bound",
                          "verdict.B1",
                          "verdict.B2",
                          "verdict.B2_source",
                          "verdict.C",
                          "verdict.h_needed",
                          "verdict.capacity_needed",
                          "verdict.quota",
                          "verdict.b_ratio",
                          "verdict.c_ratio",
                          "stats.totals"})
    EXPECT_TRUE(t.get_child_optional(key)) << key;
  EXPECT_EQ(t.get<double>("total.avoided.opens"), 140);
  EXPECT_EQ(t.get<double>("total.stager_pfs_reads"), 150);
  EXPECT_EQ(t.get<double>("verdict.B2"), 125000);
  EXPECT_EQ(t.get<double>("verdict.b_ratio"), 80);  // 1e7 / 125,000
  EXPECT_EQ(t.get<double>("verdict.c_ratio"), 2);
  EXPECT_EQ(t.get_child("epochs").front().second.get<double>("traffic.avoided.bytes"), -5e5);
  EXPECT_EQ(stats_of(r), stats);
  EXPECT_EQ(summary_text(r), summary_text(stats));
  // Pretty-printed (every value a string, as ptree writes it) still reads.
  std::ostringstream pretty;
  pt::write_json(pretty, t, true);
  EXPECT_EQ(summary_text(pretty.str()), summary_text(stats));
}

TEST(ReportSvg, EpochsLegendAndTheLastPartialInterval) {
  std::string svg = report_svg(Job().json());
  EXPECT_TRUE(has(svg, "end of epoch 2"));
  EXPECT_TRUE(has(svg, "epoch 3: 100.0% local"));
  EXPECT_TRUE(has(svg, "from tier ssd"));
  EXPECT_TRUE(has(svg, "cached fraction (right axis)"));
  EXPECT_TRUE(has(svg, ">Monarch: job 42 on n1<"));
  // The last 0.5 s is not a sample: 400,000 bytes in it draw 800,000 B/s
  // (781.25 KiB/s, y = 471 - 390 * 781.25 / 800 = 90.1; the plot spans y 81
  // to 471 under three header lines) from 14 s (x = 988.6) to the plot's
  // right edge (x = 1020). The y axis tops at 800 KiB/s.
  EXPECT_TRUE(has(svg, "988.6,90.1 1020.0,90.1")) << svg;
  EXPECT_TRUE(has(svg, ">800 KiB/s<")) << svg;
  EXPECT_TRUE(has(svg, ">time since the stager started (s)<")) << svg;
}

// `n` samples `interval` s apart of `per_sample` bytes from the tier, the
// same fraction cached throughout: a job of n * interval seconds.
std::string series_of(double interval, size_t n, double per_sample) {
  std::string bytes, cached;
  for (size_t i = 0; i < n; ++i) {
    bytes += (i ? "," : "") + std::to_string(uint64_t(per_sample));
    cached += (i ? "," : "") + std::string("1000000");
  }
  std::ostringstream o;
  o << "\"series\":{\"interval_s\":" << interval << ",\"served\":[{\"name\":\"ssd\",\"kind\":"
    << "\"tier\",\"bytes\":[" << bytes << "]},{\"name\":\"pfs\",\"kind\":\"pfs\",\"bytes\":[]},"
    << "{\"name\":\"stager\",\"kind\":\"copy\",\"bytes\":[]}],\"cached\":[{\"name\":\"ssd\","
    << "\"kind\":\"tier\",\"bytes\":[" << cached << "]}]}";
  return o.str();
}

// A job of `count` epochs of `seconds` each, every one read from the tier.
Job epochs_of(int count, double seconds, double interval) {
  Job j;
  j.epochs.clear();
  for (int e = 0; e < count; ++e)
    j.epochs.push_back(
        {e * seconds,
         (e + 1) * seconds,
         {{"opens", 100}, {"reads", 200}, {"bytes", 1e6}, {"tier_reads", 200}, {"tier_bytes", 1e6}},
         {}});
  j.elapsed = count * seconds;
  size_t n = size_t(std::llround(j.elapsed / interval));
  j.series = series_of(interval, n, 1e6 * count / n);
  return j;
}

// The points of the first polygon (the first tier's area) of a picture.
size_t area_points(const std::string& svg) {
  size_t a = svg.find("<polygon points=\""), b = svg.find('"', a + 17);
  std::istringstream in(svg.substr(a + 17, b - a - 17));
  size_t n = 0;
  for (std::string p; in >> p;) ++n;
  return n;
}

TEST(ReportSvg, BinsFollowTheJobsLength) {
  // 5 s sampled every 0.1 s, epochs of 0.2 s: every sample is a bin, 18.2
  // px wide (910 px / 50), and every epoch ends on the picture.
  std::string svg = report_svg(epochs_of(25, 0.2, 0.1).json());
  EXPECT_EQ(area_points(svg), 50u * 4) << svg;  // 2 points per bin, top and bottom
  EXPECT_TRUE(has(svg, "<title>end of epoch 25</title>"));
  EXPECT_TRUE(has(svg, ">time since the stager started (s)<"));
  // 10 hours sampled every 12.8 s (what 100 ms halved 7 times gives):
  // 2813 samples merged into bins of 128 s, at most 300 of them, in hours.
  svg = report_svg(epochs_of(100, 360, 12.8).json());
  EXPECT_LE(area_points(svg), 300u * 4);
  EXPECT_GE(area_points(svg), 250u * 4);
  EXPECT_TRUE(has(svg, ">time since the stager started (h)<"));
  EXPECT_TRUE(has(report_svg(epochs_of(30, 60, 0.8).json()), "started (min)<"));
}

TEST(ReportSvg, HeaderLinesWrapInsteadOfBeingCut) {
  Job j;
  std::string json = j.json();
  std::string long_path = "/pfs/" + std::string(300, 'x');
  json.replace(json.find("\"/pfs/d\""), 8, "\"" + long_path + "\"");
  std::string svg = report_svg(json);
  // Every text line of the header fits in the picture's 1100 px.
  size_t pos = 0;
  int header_lines = 0;
  while ((pos = svg.find("<text x=\"110.0\" y=\"", pos)) != std::string::npos) {
    size_t a = svg.find('>', pos) + 1, b = svg.find("</text>", a);
    std::string line = svg.substr(a, b - a);
    bool bold = svg.substr(pos, a - pos).find("bold") != std::string::npos;
    EXPECT_LE(110 + text_width(line, bold ? 17 : 12, bold), 1100) << line;
    ++header_lines;
    pos = b;
  }
  EXPECT_GE(header_lines, 4) << svg;  // title, the path's line, the rest, the verdict
  EXPECT_TRUE(has(svg, "/pfs/xxx")) << "the path's start is kept";
  EXPECT_TRUE(has(svg, "...xxx")) << "its middle is shortened";
}

TEST(ReportNames, TheJobOnce) {
  EXPECT_EQ(figures(Job().json()).title, "job 42");
  Job run;
  run.job = "run-4711";
  EXPECT_EQ(figures(run.json()).title, "monarch-run 4711");
  EXPECT_TRUE(summary_text(run.json()).starts_with("monarch: monarch-run 4711 on n1, dataset"));
  Job odd;
  odd.job = "k9";
  EXPECT_EQ(figures(odd.json()).title, "job k9");
  EXPECT_FALSE(has(report_svg(Job().json()), "job job"));
  EXPECT_TRUE(summary_text(Job().json()).starts_with("monarch: job 42 on n1, dataset /pfs/d"));
}

TEST(ReportSummary, StartsWithEpochTimesLocalShareAndTrafficAvoided) {
  std::istringstream in(summary_text(Job().json()));
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_GE(lines.size(), 4u);
  EXPECT_EQ(lines[1], "  passes over the dataset: 10.00 s, 2.00 s, 2.50 s");
  EXPECT_EQ(lines[2], "  served from node-local tiers: 80.0% of the bytes read, 80.0% of reads");
  EXPECT_EQ(lines[3],
            "  PFS traffic avoided: 50.0% of bytes (1.4 MiB), 46.7% of opens (140), 55.0% of "
            "reads (330)");
  // Of a long job: the first three, the last, and the median.
  std::string text = summary_text(epochs_of(40, 2, 1).json());
  EXPECT_TRUE(has(text,
                  "passes over the dataset: 2.00 s, 2.00 s, 2.00 s ... 2.00 s (40 passes; median "
                  "2.00 s)"))
      << text;
  Job none;
  none.epochs.clear();
  EXPECT_TRUE(has(summary_text(none.json()), "passes over the dataset: none yet"))
      << summary_text(none.json());
}

// A job none of whose processes loaded the job map (LD_PRELOAD cleared by
// `enroot start`, a static program): nothing of it was seen; the stager
// copied its first window ahead (40 files, 400,000 bytes).
Job unused_job() {
  Job j;
  j.epochs.clear();
  j.attached = 0;
  j.cached = 4e5;
  j.extra_totals.clear();
  j.extra_stager = {{"copies", 40}, {"pfs_opens", 40}, {"pfs_reads", 40}, {"pfs_bytes", 4e5}};
  return j;
}

TEST(ReportUnused, SaysNoProcessUsedMonarchAndWhyNotReadZero) {
  std::string text = summary_text(unused_job().json());
  std::istringstream in(text);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_GE(lines.size(), 4u) << text;
  // Right after the title, with its likely causes.
  EXPECT_EQ(lines[1].rfind("  no process of the job used Monarch: none loaded the job map", 0), 0u)
      << text;
  EXPECT_TRUE(has(lines[1], "clears LD_PRELOAD")) << text;
  EXPECT_TRUE(has(lines[1], "README, \"Containers\"")) << text;
  EXPECT_TRUE(has(lines[1], "a static or non-glibc program")) << text;
  EXPECT_EQ(lines[2],
            "  the stager's copies meanwhile: 40 opens, 40 reads, 390.6 KiB from the PFS "
            "(stage-ahead's first window: it goes further only as readers read)");
  EXPECT_TRUE(has(text, "cached: 40 files, 390.6 KiB (40.0% of the dataset)")) << text;
  // None of the figures of a job that was seen.
  for (const char* part : {"read 0 B", "passes over the dataset", "served from node-local tiers",
                           "PFS traffic avoided", "verdict", "note: no process"})
    EXPECT_FALSE(has(text, part)) << part << "\n" << text;

  pt::ptree r = tree(report_json(unused_job().json()));
  EXPECT_FALSE(r.get<bool>("used_monarch"));
  EXPECT_EQ(r.get<double>("attached.processes"), 0);
  EXPECT_EQ(r.get_child("fallbacks").front().second.get<std::string>("counter"),
            "attached.processes");
  EXPECT_EQ(r.get_child("fallbacks")
                .front()
                .second.get<std::string>("text")
                .rfind("no process of the job used Monarch", 0),
            0u);

  std::string svg = report_svg(unused_job().json());
  EXPECT_TRUE(has(svg, ">no process of the job used Monarch:")) << svg.substr(0, 2000);
  EXPECT_FALSE(has(svg, "verdict")) << svg.substr(0, 2000);
  EXPECT_FALSE(has(svg, "of the bytes read came from")) << svg.substr(0, 2000);
}

TEST(ReportUnused, OnlyWhenNoProcessAttachedAndNoneWasCounted) {
  EXPECT_TRUE(figures(Job().json()).used_monarch);
  pt::ptree r = tree(report_json(Job().json()));
  EXPECT_TRUE(r.get<bool>("used_monarch"));
  EXPECT_EQ(r.get<double>("attached.processes"), 3);
  EXPECT_EQ(r.get<std::string>("attached.first_command"), "python3");
  // Statistics written before processes were counted: nothing is claimed.
  Job old = unused_job();
  old.attached = -1;
  EXPECT_TRUE(figures(old.json()).used_monarch);
  EXPECT_EQ(tree(report_json(old.json())).get_child("attached.processes").data(), "null");
  EXPECT_FALSE(has(summary_text(old.json()), "no process of the job used Monarch"));
  // A process's counted call is a process that used Monarch, whatever the count says.
  Job counted = unused_job();
  counted.extra_totals = {{"stat_index", 1}};
  EXPECT_TRUE(figures(counted.json()).used_monarch);
}

TEST(ReportUnused, TheJobsSummaryNamesTheNodes) {
  Job a, b = unused_job();
  b.host = "n2";
  std::string text = job_summary_text({a.json(), b.json()});
  EXPECT_TRUE(has(text, "nodes where no process of the job used Monarch (")) << text;
  EXPECT_TRUE(has(text, "): n2\n")) << text;
  EXPECT_FALSE(has(job_summary_text({a.json(), a.json()}), "no process"));
}

TEST(ReportSummary, NamesAFirstProcessThatCameLate) {
  Job j;
  j.first_s = 5;  // a third of the job's 14.5 s
  EXPECT_TRUE(has(summary_text(j.json()),
                  "  the first process to use Monarch: pid 4242 (python3), 5.0 s after the map "
                  "was ready: any read of the dataset before then went to the PFS unseen\n"))
      << summary_text(j.json());
  j.first_s = 1.2;  // under a tenth of the job's time
  EXPECT_FALSE(has(summary_text(j.json()), "the first process to use Monarch"));
}

// Every percentage the summary says (shares of bytes, reads, time).
std::vector<double> percentages(const std::string& text) {
  std::vector<double> out;
  for (size_t i = text.find('%'); i != std::string::npos; i = text.find('%', i + 1)) {
    size_t b = i;
    while (b > 0 && (std::isdigit(static_cast<unsigned char>(text[b - 1])) || text[b - 1] == '.'))
      --b;
    if (b < i) out.push_back(std::stod(text.substr(b, i - b)));
  }
  return out;
}

TEST(ReportFigures, ParallelReadersNeverAShareOfTimeAbove100) {
  // Four readers: in local reads 2.4 reader-seconds per second (C/B1).
  Job j;
  j.extra_totals = {{"local_sample_bytes", 1.875e5}, {"local_sample_ns", 1e9}};  // B1 = 187,500
  Verdict v = figures(j.json()).verdict;
  EXPECT_EQ(v.bound, "local tier");
  EXPECT_TRUE(has(v.reason, "were in local reads all the time, 2.4 readers at once on average"))
      << v.reason;
  // Waiting 9 s of PFS reads in 4.5-s epochs: two readers at once.
  Verdict w = figures(half(4.5, 9).json()).verdict;
  EXPECT_TRUE(has(w.reason,
                  "were in PFS reads all the time, 2.0 readers at once on average "
                  "(9.00 s of reads in its 4.50 s)"))
      << w.reason;
  for (const std::string& text : {summary_text(j.json()), summary_text(half(4.5, 9).json())})
    for (double p : percentages(text)) EXPECT_LE(p, 100) << text;
}

TEST(ReportErrors, OneClearMessage) {
  auto message = [](const std::string& json) {
    try {
      summary_text(json);
    } catch (const ReportError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  std::string stats = Job().json();
  EXPECT_TRUE(has(message(stats.substr(0, 300)), "not valid JSON"))
      << message(stats.substr(0, 300));
  EXPECT_TRUE(has(message("{\"a\":1}"), "not Monarch statistics"));
  EXPECT_TRUE(has(message("[1,2]"), "not Monarch statistics"));
  EXPECT_TRUE(has(message("{\"schema\":\"monarch-stats/1\"}"), "truncated"));  // both read
  EXPECT_TRUE(has(message("{\"schema\":\"monarch-stats/2\"}"), "truncated"));
  EXPECT_TRUE(has(message("  \n"), "the file is empty"));
  EXPECT_TRUE(has(message("{\"schema\":\"monarch-stats/3\"}"), "another version of Monarch"));
  EXPECT_TRUE(has(message("{\"schema\":\"monarch-report/1\"}"), "without its statistics"));
  EXPECT_TRUE(has(message(std::string(100000, '[')), "nested too deeply"));
  std::string odd = stats;  // wrong types are no crash
  odd.replace(odd.find("\"epochs\":["), 10, "\"epochs\":5,\"x\":[");
  EXPECT_EQ(message(odd), "(no error)");
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(WriteReports, ThreeFilesAtomicallyAndOnePerHost) {
  char tmpl[] = "/tmp/monarch-report-test-XXXXXX";
  ASSERT_TRUE(mkdtemp(tmpl));
  std::string dir = tmpl;
  std::vector<std::string> paths = write_reports(Job().json(), dir);
  EXPECT_EQ(paths,
            (std::vector<std::string>{dir + "/monarch-job42.txt", dir + "/monarch-job42.json",
                                      dir + "/monarch-job42.svg"}));
  EXPECT_EQ(slurp(paths[0]), summary_text(Job().json()));
  EXPECT_EQ(stats_of(slurp(paths[1])), Job().json());
  EXPECT_EQ(paths, write_reports(Job().json(), dir));  // the same host again: replaced
  Job other;
  other.host = "n2";
  EXPECT_EQ(write_reports(other.json(), dir)[1], dir + "/monarch-job42-n2.json");
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  EXPECT_EQ(names.size(), 6u) << "temporary files left behind?";
  for (const std::string& n : names) unlink((dir + "/" + n).c_str());
  rmdir(dir.c_str());
  try {
    write_reports(Job().json(), dir + "/missing");
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const std::runtime_error& e) {
    EXPECT_TRUE(has(e.what(), dir + "/missing: No such file or directory")) << e.what();
  }
  EXPECT_THROW(write_reports("{}", "/tmp"), ReportError);
}

TEST(Explain, EveryCounterWithItsMeaning) {
  std::string text = explain_text();
#define MONARCH_TEST_EXPLAIN(name, n, meaning) \
  EXPECT_TRUE(has(text, std::string(#name) + ": " + meaning));
  MONARCH_PROCESS_COUNTERS(MONARCH_TEST_EXPLAIN)
#undef MONARCH_TEST_EXPLAIN
#define MONARCH_TEST_EXPLAIN_S(name, meaning) EXPECT_TRUE(has(text, "stager." #name ": " meaning));
  MONARCH_STAGER_COUNTERS(MONARCH_TEST_EXPLAIN_S)
#undef MONARCH_TEST_EXPLAIN_S
}

// Mappings are counted apart from reads: a job that read 1,000,000 bytes
// and mapped 4,000,000 (3,000,000 of a copy) is served what its reads were,
// and the mappings are one line of their own and keys of the JSON.
TEST(ReportMappings, ApartFromReads) {
  Job j;
  j.extra_totals["mmaps"] = 4;
  j.extra_totals["mmap_local"] = 3;
  j.extra_totals["mmap_bytes"] = 4e6;
  j.extra_totals["mmap_local_bytes"] = 3e6;
  Figures f = figures(j.json());
  EXPECT_DOUBLE_EQ(f.total.hit(), 0.8);  // as without the mappings
  EXPECT_DOUBLE_EQ(f.total.mmap_bytes, 4e6);
  std::string text = summary_text(j.json());
  EXPECT_TRUE(has(text, "served from node-local tiers: 80.0% of the bytes read, 80.0% of reads"))
      << text;
  EXPECT_TRUE(has(text,
                  "  mappings: 4 (3 of node-local copies), 3.8 MiB mapped (75.0% of it local): "
                  "their pages are read unseen, so they are counted neither as reads nor in "
                  "passes\n"))
      << text;
  EXPECT_FALSE(has(summary_text(Job().json()), "mappings:"));
  pt::ptree r = tree(report_json(j.json()));
  EXPECT_EQ(r.get<double>("total.mmaps"), 4);
  EXPECT_EQ(r.get<double>("total.mmap_local"), 3);
  EXPECT_EQ(r.get<double>("total.mmap_bytes"), 4e6);
  EXPECT_EQ(r.get<double>("total.mmap_local_bytes"), 3e6);
  EXPECT_EQ(r.get<double>("total.bytes"), 3e6);
}

// More PFS traffic than without Monarch is said in bytes, never as a share
// outside 0-100%: in the text and in the JSON's fractions.
TEST(ReportFigures, NoShareOutside0To100) {
  Job j;  // the stager copied 100,000,000 bytes while the job read 1,000,000 in pass 1
  j.epochs.resize(1);
  j.epochs[0].stager["pfs_bytes"] = 1e8;
  std::string text = summary_text(j.json());
  EXPECT_FALSE(std::regex_search(text, std::regex("-[0-9.]+%"))) << text;
  EXPECT_TRUE(has(text,
                  "PFS traffic avoided: none of bytes (95.0 MiB more than without Monarch: "
                  "copies ahead)"))
      << text;
  pt::ptree r = tree(report_json(j.json()));
  EXPECT_EQ(r.get<double>("total.avoided.bytes_fraction"), 0);
  EXPECT_LT(r.get<double>("total.avoided.bytes"), 0);  // the signed difference stays
  for (auto& e : r.get_child("epochs"))
    EXPECT_GE(e.second.get<double>("traffic.avoided.bytes_fraction"), 0);
}

// A failed copy says the error it got: permission denied apart, the last
// other one by its symbol and words.
TEST(ReportFigures, CopyErrorsNamedByTheirErrno) {
  Job j;
  j.extra_stager = {{"copy_errors", 3}, {"copy_denied", 2}, {"copy_errno", EIO}};
  std::string text = summary_text(j.json());
  EXPECT_TRUE(has(text,
                  "note: 2 copies failed: permission denied (EACCES) reading the PFS file: read "
                  "from the PFS"))
      << text;
  EXPECT_TRUE(has(text,
                  "note: 1 copies failed (last error: EIO, Input/output error): read from the "
                  "PFS"))
      << text;
  EXPECT_FALSE(has(text, "I/O error")) << text;
  j.extra_stager = {{"copy_errors", 2}, {"copy_denied", 2}};
  EXPECT_FALSE(has(summary_text(j.json()), "copies failed (")) << summary_text(j.json());
}

// A job that read many times the dataset's bytes without a pass (re-reads of
// a few files) is told so, not "none yet".
TEST(ReportSummary, BytesWithoutAPass) {
  Job j;
  j.epochs.resize(1);
  j.epochs[0].end = 3;
  j.epochs[0].job["bytes"] = 5e6;
  std::string json = j.json();
  json = std::regex_replace(json, std::regex("\"complete\":true,\"start_s\""),
                            "\"complete\":false,\"start_s\"");
  std::string text = summary_text(json);
  EXPECT_TRUE(has(text,
                  "passes over the dataset: none: the job read 5.0x the dataset's bytes, "
                  "re-reading a few of its files (a pass opens most of them)"))
      << text;
}

}  // namespace
}  // namespace monarch
