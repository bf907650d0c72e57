#include <gtest/gtest.h>

#include "fast_fs.h"

namespace monarch {
namespace {

// n samples of a file system whose opens take `open_us` and whose reads take
// `ratio` times the tier's.
std::vector<TierSample> samples(int n, double open_us, double ratio) {
  std::vector<TierSample> out;
  for (int i = 0; i < n; ++i)
    out.push_back({uint64_t(open_us * 1e3), uint64_t(ratio * 100'000), 100'000});
  return out;
}

TEST(FastFs, ALocalDiskIsFastAPfsIsNot) {
  EXPECT_TRUE(fast_by_tier(samples(8, 10, 1.2)).fast);
  EXPECT_FALSE(fast_by_tier(samples(8, 10, 2.0)).fast) << "reads slower than the tier's";
  EXPECT_FALSE(fast_by_tier(samples(8, 1500, 1.0)).fast) << "opens of a metadata server";
  Verdict v = fast_by_tier(samples(8, 10, 1.2));
  EXPECT_DOUBLE_EQ(v.open_us, 10);
  EXPECT_DOUBLE_EQ(v.read, 1.2);
}

TEST(FastFs, MediansNotMeansOrSingleFiles) {
  // Three preempted files out of eight do not hide a fast file system ...
  auto s = samples(5, 10, 1.0);
  for (int i = 0; i < 3; ++i) s.push_back({50'000'000, 700'000, 100'000});
  EXPECT_TRUE(fast_by_tier(s).fast);
  // ... nor do three quick ones make a slow one fast.
  s = samples(5, 2000, 5.0);
  for (int i = 0; i < 3; ++i) s.push_back({5'000, 50'000, 100'000});
  EXPECT_FALSE(fast_by_tier(s).fast);
}

TEST(FastFs, AFileNotReadBackCountsAsSlow) {
  auto s = samples(3, 10, 1.0);
  for (int i = 0; i < 5; ++i) s.push_back({5'000'000, 1'000'000, 0});  // slow open: not read back
  EXPECT_FALSE(fast_by_tier(s).fast);
  EXPECT_TRUE(fast_open(100'000));
  EXPECT_FALSE(fast_open(100'001));
  EXPECT_FALSE(fast_by_tier({}).fast);
}

TEST(FastFs, AReadBackFromACacheIsLeftOut) {
  // The copy's first read of 128 KiB took 2 ms (a disk behind the server);
  // read back in 0.1 ms, the bytes came from the server's memory: no sample.
  EXPECT_TRUE(read_back_cached(2'000'000, 100'000));
  // A local disk: the first read also read the file's metadata (up to 2.6x).
  EXPECT_FALSE(read_back_cached(260'000, 100'000));
  EXPECT_FALSE(read_back_cached(400'000, 100'000)) << "4x: still a sample";
  EXPECT_TRUE(read_back_cached(400'001, 100'000));
  EXPECT_FALSE(read_back_cached(100'000, 400'000)) << "a slower read back is a sample";
}

TEST(FastFs, MeanRatesNeedEnoughFilesAndBytes) {
  // 8 opens of 10 us, 8 MiB at 0.2 GB/s a thread.
  uint64_t bytes = 8 << 20, read_ns = uint64_t(double(bytes) / 0.2);
  EXPECT_TRUE(fast_by_rates(8, 80'000, bytes, read_ns).fast);
  EXPECT_FALSE(fast_by_rates(7, 70'000, bytes, read_ns).fast) << "too few files";
  EXPECT_FALSE(fast_by_rates(8, 80'000, bytes - 1, read_ns).fast) << "too few bytes";
  EXPECT_FALSE(fast_by_rates(8, 80'000, bytes, read_ns * 4).fast) << "0.05 GB/s: NFS over 1 GbE";
  EXPECT_FALSE(fast_by_rates(8, 8'000'000, bytes, read_ns).fast) << "1 ms opens";
  EXPECT_FALSE(fast_by_rates(8, 80'000, bytes, 0).fast);
}

}  // namespace
}  // namespace monarch
