#include <gtest/gtest.h>

#include <string>

#include "report.h"

namespace monarch {
namespace {

// Statistics of a 3-epoch job over a 1000-byte dataset: epoch 1 from the PFS
// (10 s), epochs 2 and 3 from the tier (2 s each).
std::string stats(bool complete = true, double copy_bytes = 1000, double fill = 4,
                  double noroom = 0) {
  auto counters = [](double opens, double bytes, double local, double pfs_reads, double copies) {
    return "{\"opens\":" + std::to_string(opens) + ",\"reads\":" + std::to_string(2 * opens) +
           ",\"bytes\":" + std::to_string(bytes) + ",\"tier_bytes\":[" + std::to_string(local) +
           "],\"pfs_opens\":" + std::to_string(bytes > local ? opens : 0) +
           ",\"pfs_reads\":" + std::to_string(pfs_reads) +
           ",\"pfs_bytes\":" + std::to_string(bytes - local) +
           ",\"local_sample_bytes\":4096,\"local_sample_ns\":1000,\"fb_wait\":0" +
           ",\"stager\":{\"pfs_opens\":0,\"pfs_reads\":0,\"pfs_bytes\":" + std::to_string(copies) +
           ",\"pfs_read_ns\":4000000000,\"noroom\":0}}";
  };
  std::string s = "{\"schema\":\"monarch-stats/1\",\"complete\":";
  s += complete ? "true" : "false";
  s += ",\"job\":\"job42\",\"host\":\"n1\",\"user\":\"u\",\"dataset\":\"/d\",\"elapsed_s\":14,"
       "\"settings\":{\"copy_threads\":4},"
       "\"tiers\":[{\"name\":\"ssd\",\"dir\":\"/t\",\"quota\":2000,\"used\":1000,\"full\":false}],"
       "\"index\":{\"files\":10,\"bytes\":1000},"
       "\"cached\":{\"files\":10,\"bytes\":1000,\"fill_seconds\":" +
       std::to_string(fill) + "},";
  s += "\"totals\":{\"opens\":30,\"reads\":60,\"bytes\":3000,\"tier_bytes\":[2000],"
       "\"pfs_opens\":10,\"pfs_reads\":20,\"pfs_bytes\":1000,\"local_sample_bytes\":4096,"
       "\"local_sample_ns\":1000,\"fb_wait\":3,\"stager\":{\"pfs_opens\":0,\"pfs_reads\":0,"
       "\"pfs_bytes\":" +
       std::to_string(copy_bytes) +
       ",\"pfs_read_ns\":4000000000,\"noroom\":" + std::to_string(noroom) + "}},";
  s += "\"epochs\":[{\"number\":1,\"complete\":true,\"start_s\":0,\"end_s\":10,\"counters\":" +
       counters(10, 1000, 0, 20, copy_bytes) + "},";
  s += "{\"number\":2,\"complete\":true,\"start_s\":10,\"end_s\":12,\"counters\":" +
       counters(10, 1000, 1000, 0, 0) + "},";
  s += "{\"number\":3,\"complete\":true,\"start_s\":12,\"end_s\":14,\"counters\":" +
       counters(10, 1000, 1000, 0, 0) + "}],";
  s += "\"series\":{\"interval_s\":1,\"served\":[{\"name\":\"ssd\",\"kind\":\"tier\","
       "\"bytes\":[0,0,500,500]},{\"name\":\"pfs\",\"kind\":\"pfs\",\"bytes\":[100,900,0,0]}],"
       "\"cached\":[{\"name\":\"ssd\",\"kind\":\"tier\",\"bytes\":[100,1000,1000,1000]}]}}";
  return s;
}

TEST(Report, TrafficAvoidedPerEpoch) {
  Figures f = figures(stats());
  EXPECT_EQ(f.job, "job42");
  ASSERT_EQ(f.epochs.size(), 3u);
  EXPECT_DOUBLE_EQ(f.epochs[0].seconds, 10);
  EXPECT_DOUBLE_EQ(f.epochs[0].traffic.hit(), 0);
  EXPECT_DOUBLE_EQ(f.epochs[1].traffic.hit(), 1);
  EXPECT_DOUBLE_EQ(f.epochs[1].traffic.pfs_opens, 0);
  // The stager's copies count as PFS traffic.
  EXPECT_DOUBLE_EQ(f.epochs[0].traffic.pfs_bytes, 2000);
  EXPECT_DOUBLE_EQ(f.total.pfs_bytes, 2000);
  EXPECT_DOUBLE_EQ(f.total.opens, 30);
  EXPECT_DOUBLE_EQ(f.total.pfs_opens, 10);
  std::string text = summary_text(stats());
  EXPECT_NE(text.find("avoided 66.7% of opens"), std::string::npos) << text;
  EXPECT_NE(text.find("epoch 2: 2.00 s, local 100.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("3 reads did not wait for a copy"), std::string::npos) << text;
}

TEST(Report, VerdictFromTheRoofline) {
  // C = 1000 B / 2 s = 500 B/s; B2 = 1000 B / 4 s = 250 B/s: h* = 1 - 250/500 = 0.5.
  Verdict v = figures(stats()).verdict;
  EXPECT_DOUBLE_EQ(v.C, 500);
  EXPECT_DOUBLE_EQ(v.B2, 250);
  EXPECT_DOUBLE_EQ(v.h_needed, 0.5);
  EXPECT_DOUBLE_EQ(v.capacity_needed, 500);
  EXPECT_EQ(v.bound, "compute");  // all of it is cached
  EXPECT_DOUBLE_EQ(v.B1, 4096 / 1e-6);
  // A fast PFS needs no cache at all.
  EXPECT_DOUBLE_EQ(figures(stats(true, 1000, 1)).verdict.h_needed, 0);
}

TEST(Report, VerdictPfsBoundWhenTooLittleIsCached) {
  std::string s = stats();
  s.replace(s.find("\"cached\":{\"files\":10,\"bytes\":1000"), 33,
            "\"cached\":{\"files\":2,\"bytes\":200");
  Verdict v = figures(s).verdict;
  EXPECT_EQ(v.bound, "pfs");
  EXPECT_NE(summary_text(s).find("only 20.0% of the dataset is cached, 50.0% is needed"),
            std::string::npos);
}

TEST(Report, UndecidedWithoutACachedEpoch) {
  std::string s = stats();
  s = s.substr(0, s.find(",{\"number\":2")) + "]," + s.substr(s.find("\"series\""));
  Verdict v = figures(s).verdict;
  EXPECT_EQ(v.bound, "undecided");
}

TEST(Report, IncompleteAndFallbacksInWords) {
  std::string text = summary_text(stats(false, 1000, 4, 7));
  EXPECT_NE(text.find("[incomplete]"), std::string::npos);
  EXPECT_NE(text.find("the statistics are incomplete"), std::string::npos);
  EXPECT_NE(text.find("7 files did not fit on any tier (ssd 1000 B of 2.0 KiB)"), std::string::npos)
      << text;
}

TEST(Report, ReportJsonEmbedsTheStatisticsAndReadsBack) {
  std::string r = report_json(stats());
  EXPECT_NE(r.find("\"schema\":\"monarch-report/1\""), std::string::npos);
  EXPECT_EQ(stats_of(r), stats());
  EXPECT_EQ(summary_text(r), summary_text(stats()));
  EXPECT_NE(report_svg(r).find("end of epoch 2"), std::string::npos);
}

TEST(Report, BadInputIsOneClearError) {
  auto message = [](const std::string& json) {
    try {
      summary_text(json);
    } catch (const ReportError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message(stats().substr(0, 300)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(message("{\"a\":1}").find("not Monarch statistics"), std::string::npos);
  EXPECT_NE(message("{\"schema\":\"monarch-stats/1\"}").find("truncated"), std::string::npos);
  EXPECT_NE(message("").find("not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace monarch
