// The statistics' time series, driven with times of the test's choosing: one
// sample per 0.1 s, intervals with no beat kept in place, halved in
// resolution past 3600 samples, and bytes never lost on the way.
#include <gtest/gtest.h>

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "index.h"
#include "placement.h"
#include "stats.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;
namespace pt = boost::property_tree;

constexpr uint64_t kMs = 1'000'000;

class StatsSeries : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("monarch-stats-test-" + std::to_string(getpid()));
    fs::create_directories(dir / "ds");
    std::ofstream(dir / "ds/a") << "0123456789";
    IndexOptions o{.root = (dir / "ds").string(),
                   .out_path = (dir / "index").string(),
                   .tier_dirs = {dir.string()},
                   .small_file_max = 1 << 20,
                   .stall_ns = 200'000'000,
                   .generation = 1};
    mapped = build_index(o, index, [](JobMap&) {});
    JobInfo info{.job = "job1", .tier_names = {"t"}, .tier_dirs = {dir.string()}};
    stats = std::make_unique<Stats>(mapped.map(), counters, placement, info, index);
    start = monotonic_ns();  // just after the statistics' own start
  }
  void TearDown() override { fs::remove_all(dir); }

  // The stager's copies series and its interval, as the statistics say them.
  std::pair<double, std::vector<double>> copies() {
    pt::ptree t;
    std::istringstream in(stats->json(true, 0));
    pt::read_json(in, t);
    std::vector<double> bytes;
    for (auto& s : t.get_child("series.served"))
      if (s.second.get<std::string>("kind") == "copy")
        for (auto& b : s.second.get_child("bytes")) bytes.push_back(b.second.get_value<double>());
    return {t.get<double>("series.interval_s"), bytes};
  }
  // `bytes` copied by the stager, then a sample at `ms` after the start.
  void copy_then_sample(uint64_t bytes, uint64_t ms) {
    counters[s_pfs_bytes] += bytes;
    stats->sample(start + ms * kMs);
  }

  fs::path dir;
  IndexStats index;
  MappedMap mapped;
  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  Placement placement{{{1 << 30, 4096}}, [](int) { return uint64_t(1) << 30; }, 0};
  std::unique_ptr<Stats> stats;
  uint64_t start = 0;
};

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// The job's processes that loaded the map, as the library leaves them in its
// header: the count, and the first one once its pid is there (written last).
TEST_F(StatsSeries, ProcessesThatLoadedTheMapAndTheFirst) {
  Header& h = mapped.map().header();
  auto attached = [&] {
    pt::ptree t;
    std::istringstream in(stats->json(true, 0));
    pt::read_json(in, t);
    return t.get_child("attached");
  };
  EXPECT_EQ(attached().get<int>("processes"), 0);
  EXPECT_EQ(attached().get<int>("first_pid"), 0);
  h.attached = 1;  // counted, its pid not written yet: no first process
  std::memcpy(h.first_attached_comm, "train\x01\"er", 9);  // the job's own bytes
  h.first_attached_ns = start + 1500 * kMs;
  stats->sample(start + 100 * kMs);
  EXPECT_EQ(stats->attached().first_pid, 0);
  h.first_attached_pid = 4242;
  h.attached = 3;
  stats->sample(start + 200 * kMs);
  Stats::Attached a = stats->attached();
  EXPECT_EQ(a.processes, 3u);
  EXPECT_EQ(a.first_pid, 4242);
  EXPECT_EQ(a.first_command, "train\x01\"er");
  EXPECT_NEAR(a.first_s, 1.5, 0.1);
  pt::ptree t = attached();  // valid JSON whatever the name holds
  EXPECT_EQ(t.get<int>("processes"), 3);
  EXPECT_EQ(t.get<int>("first_pid"), 4242);
  EXPECT_EQ(t.get<std::string>("first_command"), "train\x01\"er");
  h.first_attached_pid = 7;  // kept from the first sight
  EXPECT_EQ(stats->attached().first_pid, 4242);
}

TEST_F(StatsSeries, OneSamplePerTenthOfASecondInPlace) {
  for (uint64_t ms = 101; ms <= 1001; ms += 100) copy_then_sample(1000, ms);
  copy_then_sample(500, 1050);  // within the 11th interval: nothing closes yet
  copy_then_sample(700, 1720);  // a late beat: intervals 11 to 16 end at once
  auto [interval, bytes] = copies();
  EXPECT_EQ(interval, 0.1);
  ASSERT_EQ(bytes.size(), 17u);
  EXPECT_EQ(bytes[0], 1000);
  EXPECT_EQ(bytes[9], 1000);
  EXPECT_EQ(bytes[10], 0);     // the beat at 1.05 s closed nothing: its bytes wait
  EXPECT_EQ(bytes[15], 0);     // no beat in it: kept, empty, in its place
  EXPECT_EQ(bytes[16], 1200);  // what the intervals without a beat saw
}

TEST_F(StatsSeries, HalvedPastTheLimitAndAfterALongPauseWithoutLosingBytes) {
  uint64_t ms = 0, copied = 0;
  for (int i = 0; i < 3700; ++i) copy_then_sample(10, ms += 100), copied += 10;
  auto [interval, bytes] = copies();
  EXPECT_EQ(interval, 0.2);
  EXPECT_LT(bytes.size(), 3600u);
  EXPECT_EQ(sum(bytes), copied);
  // A stager stopped for 10 hours: one sample ends 180,000 intervals of 0.2 s.
  copy_then_sample(5000, ms += 36'000'000);
  copied += 5000;
  std::tie(interval, bytes) = copies();
  EXPECT_EQ(interval, 12.8);  // 0.2 s doubled until 36,370 s are under 3600 samples
  EXPECT_LT(bytes.size(), 3600u);
  EXPECT_EQ(sum(bytes), copied);
  EXPECT_NEAR(bytes.size() * interval, ms / 1e3, interval);
}

// Passes over the dataset (Stats::tick): 100 files of 1,000 bytes, read by
// one thread whose counters the test writes as the library would.
class StatsPasses : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("monarch-passes-test-" + std::to_string(getpid()));
    fs::create_directories(dir / "ds");
    for (int i = 0; i < 100; ++i)
      std::ofstream(dir / "ds" / ("f" + std::to_string(1000 + i))) << std::string(1000, 'x');
    IndexOptions o{.root = (dir / "ds").string(),
                   .out_path = (dir / "index").string(),
                   .tier_dirs = {dir.string()},
                   .small_file_max = 0,
                   .stall_ns = 200'000'000,
                   .generation = 1};
    mapped = build_index(o, index, [](JobMap&) {});
    ASSERT_EQ(mapped.map().header().dataset_bytes, 100'000u);
    mapped.map().header().next_slot.store(1);
    JobInfo info{.job = "job1", .tier_names = {"t"}, .tier_dirs = {dir.string()}};
    stats = std::make_unique<Stats>(mapped.map(), counters, placement, info, index);
    start = monotonic_ns();
  }
  void TearDown() override { fs::remove_all(dir); }

  void add(int c, uint64_t n = 1) {
    std::atomic<uint64_t>& v = mapped.map().slot(0).c[c];
    v.store(v.load() + n);
  }
  // File `id` opened and read whole from the tier, then a poll 1 ms later.
  void read_file(uint32_t id) {
    add(c_opens);
    add(c_pass_opens + id % kPassBuckets);
    add(c_tier_reads);
    add(c_tier_bytes, mapped.map().entry(id).size);
    stats->tick(start + (ms += 1) * kMs);
  }
  void epoch(uint32_t first = 0) {
    for (uint32_t i = 0; i < 100; ++i) read_file((first + i * 37) % 100);  // a shuffled order
  }
  // (complete passes, bytes of each pass) as the statistics say them.
  std::pair<int, std::vector<double>> passes() {
    pt::ptree t;
    std::istringstream in(stats->json(true, 0));
    pt::read_json(in, t);
    int complete = 0;
    std::vector<double> bytes;
    for (auto& e : t.get_child("epochs")) {
      complete += e.second.get<bool>("complete");
      bytes.push_back(e.second.get<double>("counters.bytes"));
    }
    return {complete, bytes};
  }

  fs::path dir;
  IndexStats index;
  MappedMap mapped;
  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  Placement placement{{{1 << 30, 4096}}, [](int) { return uint64_t(1) << 30; }, 0};
  std::unique_ptr<Stats> stats;
  uint64_t start = 0, ms = 0;
};

TEST_F(StatsPasses, ThreeEpochsAreThreePasses) {
  epoch(0), epoch(5), epoch(11);
  auto [complete, bytes] = passes();
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(bytes, std::vector<double>({100'000, 100'000, 100'000}));
}

// A loader that opens the next epoch's first files before the last ones of
// this epoch are read (workers prefetching: 20 files opened ahead, read
// after the boundary) still makes one pass an epoch.
TEST_F(StatsPasses, PrefetchedOpensStillMakeAPassAnEpoch) {
  auto open = [&](uint32_t id) { add(c_opens), add(c_pass_opens + id % kPassBuckets); };
  auto read = [&](uint32_t id) {
    add(c_tier_reads), add(c_tier_bytes, 1000);
    stats->tick(start + (ms += 1) * kMs);
  };
  for (int e = 0; e < 3; ++e)
    for (uint32_t i = 0; i < 100; ++i) {
      if (e == 0 || i >= 20) open(i);
      if (i == 80 && e < 2)
        for (uint32_t j = 0; j < 20; ++j) open(j);
      read(i);
    }
  auto [complete, bytes] = passes();
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(bytes, std::vector<double>({100'000, 100'000, 100'000}));
}

// A job faster than the polls: one poll per 150 files, an epoch and a half.
TEST_F(StatsPasses, AFastJobBetweenPolls) {
  int n = 0;
  for (int e = 0; e < 3; ++e)
    for (uint32_t i = 0; i < 100; ++i) {
      add(c_opens), add(c_pass_opens + i % kPassBuckets);
      add(c_tier_reads), add(c_tier_bytes, 1000);
      if (++n % 150 == 0 || n == 300) stats->tick(start + (ms += 1) * kMs);
    }
  auto [complete, bytes] = passes();
  EXPECT_EQ(complete, 3);
  EXPECT_EQ(bytes, std::vector<double>({100'000, 100'000, 100'000}));
}

// One file re-read 500 times: 5 times the dataset's bytes, no pass.
TEST_F(StatsPasses, ReReadsOfOneFileAreNoPass) {
  for (int i = 0; i < 500; ++i) read_file(7);
  auto [complete, bytes] = passes();
  EXPECT_EQ(complete, 0);
  EXPECT_EQ(bytes, std::vector<double>({500'000}));
  epoch();  // then a real one: every file
  EXPECT_EQ(passes().first, 1);
}

// Mappings are not bytes read: a job that maps every file counts no pass.
TEST_F(StatsPasses, MappingsAreNoBytesRead) {
  for (int r = 0; r < 3; ++r)
    for (uint32_t i = 0; i < 100; ++i) {
      add(c_opens);
      add(c_pass_opens + i % kPassBuckets);
      add(c_mmaps);
      add(c_mmap_bytes, 1000);
      stats->tick(start + (ms += 1) * kMs);
    }
  EXPECT_EQ(passes().first, 0);
}

}  // namespace
}  // namespace monarch
