#include "ahead.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace monarch {
namespace {

constexpr uint64_t MiB = 1 << 20;

TEST(AheadRoom, WithoutReadersTheWindowIsTheSetting) {
  EXPECT_TRUE(ahead_room(10 * MiB, 0, 0, 0, 6 * MiB));
  EXPECT_TRUE(ahead_room(10 * MiB, 6 * MiB, 0, 0, 4 * MiB)) << "up to the window";
  EXPECT_FALSE(ahead_room(10 * MiB, 6 * MiB, 0, 0, 5 * MiB)) << "past the window";
  EXPECT_TRUE(ahead_room(10 * MiB, 0, 0, 0, 50 * MiB)) << "a larger file when none is unread";
  EXPECT_TRUE(ahead_room(10 * MiB, 6 * MiB, 6 * MiB, 0, 10 * MiB)) << "opened copies move it";
}

TEST(AheadRoom, TheWindowGrowsToAThirdOfWhatReadersRead) {
  EXPECT_FALSE(ahead_room(10 * MiB, 10 * MiB, 0, 30 * MiB, 1)) << "a third of 30 MiB: 10";
  EXPECT_TRUE(ahead_room(10 * MiB, 10 * MiB, 0, 33 * MiB, 1 * MiB));
  // 60 MiB opened of 80 copied ahead, 30 asked: the window is 30 MiB, 20 unread.
  EXPECT_TRUE(ahead_room(10 * MiB, 80 * MiB, 60 * MiB, 30 * MiB, 10 * MiB));
  EXPECT_FALSE(ahead_room(10 * MiB, 80 * MiB, 60 * MiB, 30 * MiB, 11 * MiB));
}

// A job reads a share of a dataset once, in a random order, while stage-ahead
// copies the rest smallest first as far as the rule lets it. Returns the
// bytes the PFS serves: what readers read that was not copied ahead, and
// every copy made ahead.
// `fixed`: the rule before the window grew (the setting's window only).
// `found`: the bytes readers found copied ahead.
uint64_t pfs_bytes(const std::vector<uint64_t>& sizes, double share, uint64_t base, uint64_t& part,
                   uint64_t* found = nullptr, bool fixed = false) {
  std::mt19937 rng(7);
  std::vector<size_t> reads(sizes.size()), order(sizes.size());
  std::iota(reads.begin(), reads.end(), 0);
  std::shuffle(reads.begin(), reads.end(), rng);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] < sizes[b]; });
  uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  std::vector<bool> copied(sizes.size()), read(sizes.size());
  uint64_t ahead = 0, opened = 0, asked = 0, served = 0;
  part = 0;
  size_t next = 0;
  for (size_t f : reads) {
    if (part + sizes[f] > share * total) break;
    part += sizes[f];
    read[f] = true;
    if (copied[f]) {
      opened += sizes[f];
    } else {
      asked += sizes[f];
      served += sizes[f];
      copied[f] = true;
    }
    while (next < order.size() && copied[order[next]]) ++next;
    auto room = [&](uint64_t size) {
      uint64_t unread = ahead - std::min(ahead, opened);
      return fixed ? unread == 0 || unread + size <= base
                   : ahead_room(base, ahead, opened, asked, size);
    };
    while (next < order.size() && room(sizes[order[next]])) {
      copied[order[next]] = true;
      ahead += sizes[order[next]];
      served += sizes[order[next]];
      while (next < order.size() && copied[order[next]]) ++next;
    }
  }
  if (found) *found = opened;
  return served;
}

TEST(AheadRoom, APartCostsThePfsThatPartAndAtMostAThirdMore) {
  std::mt19937 rng(1);
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 2000; ++i) sizes.push_back(16 * 1024 + rng() % (240 * 1024));
  for (int i = 0; i < 24; ++i) sizes.push_back(4 * MiB + rng() % (20 * MiB));
  uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  uint64_t base = total / 25, largest = *std::max_element(sizes.begin(), sizes.end());
  for (double share : {0.0, 0.02, 0.1, 0.3, 0.6}) {
    uint64_t part = 0, served = pfs_bytes(sizes, share, base, part);
    EXPECT_LE(served, part + std::max(base, part / kAheadPerShown) + largest)
        << "a job reading " << share << " of the dataset";
    EXPECT_GE(served, part);
  }
  // Reading the whole dataset, readers find far more of it copied ahead than
  // the setting's window alone let them (each file comes from the PFS once).
  uint64_t part = 0, found = 0, found_fixed = 0;
  EXPECT_EQ(pfs_bytes(sizes, 1.0, base, part, &found), total);
  EXPECT_EQ(pfs_bytes(sizes, 1.0, base, part, &found_fixed, true), total);
  EXPECT_GT(found, 2 * found_fixed)
      << found << " bytes found copied ahead, " << found_fixed << " with the setting's window only";
}

}  // namespace
}  // namespace monarch
