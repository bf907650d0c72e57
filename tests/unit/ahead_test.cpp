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
  // 60 MiB opened of 80 copied ahead, 90 shown: the window is 30 MiB, 20 unread.
  EXPECT_TRUE(ahead_room(10 * MiB, 80 * MiB, 60 * MiB, 90 * MiB, 10 * MiB));
  EXPECT_FALSE(ahead_room(10 * MiB, 80 * MiB, 60 * MiB, 90 * MiB, 11 * MiB));
}

// A job reads a share of a dataset once, in a random order, while stage-ahead
// copies the rest smallest first as far as the rule lets it, as Copier does:
// a file no copy holds yet is asked for (its copy or the reader's hand-over:
// once from the PFS). With `twice`, a large one (over 1 MiB) is read by its
// reader from the PFS as well, ahead of its copy: the worst case, which moves
// the window on (`opened`) without widening it. Returns the bytes the PFS
// serves, those read twice, and what readers found copied ahead. `fixed`: the
// rule before the window grew (the setting's window only).
struct Reading {
  uint64_t part = 0, served = 0, twice = 0, found = 0;
};
Reading read_part(const std::vector<uint64_t>& sizes, double share, uint64_t base, bool twice,
                  bool fixed = false) {
  std::mt19937 rng(7);
  std::vector<size_t> reads(sizes.size()), order(sizes.size());
  std::iota(reads.begin(), reads.end(), 0);
  std::shuffle(reads.begin(), reads.end(), rng);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] < sizes[b]; });
  uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  std::vector<bool> copied(sizes.size());
  uint64_t ahead = 0, opened = 0, asked = 0;
  Reading r;
  size_t next = 0;
  auto room = [&](uint64_t size) {
    uint64_t unread = ahead - std::min(ahead, opened);
    return fixed ? unread == 0 || unread + size <= base
                 : ahead_room(base, ahead, opened, asked + r.found, size);
  };
  for (size_t f : reads) {
    if (r.part + sizes[f] > share * total) break;
    r.part += sizes[f];
    if (copied[f]) {
      opened += sizes[f];
      r.found += sizes[f];
    } else {
      copied[f] = true;
      asked += sizes[f];
      r.served += sizes[f];
      if (twice && sizes[f] > MiB) opened += sizes[f], r.served += sizes[f], r.twice += sizes[f];
    }
    for (;;) {
      while (next < order.size() && copied[order[next]]) ++next;
      if (next == order.size() || !room(sizes[order[next]])) break;
      copied[order[next]] = true;
      ahead += sizes[order[next]];
      r.served += sizes[order[next]];
    }
  }
  return r;
}

TEST(AheadRoom, APartCostsThePfsThatPartAndAtMostAThirdMore) {
  std::mt19937 rng(1);
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 2000; ++i) sizes.push_back(16 * 1024 + rng() % (240 * 1024));
  for (int i = 0; i < 24; ++i) sizes.push_back(4 * MiB + rng() % (20 * MiB));
  uint64_t total = std::accumulate(sizes.begin(), sizes.end(), uint64_t{0});
  uint64_t base = total / 25, largest = *std::max_element(sizes.begin(), sizes.end());
  for (double share : {0.0, 0.02, 0.1, 0.3, 0.6})
    for (bool twice : {false, true}) {
      Reading r = read_part(sizes, share, base, twice);
      // What readers read from the PFS lets stage-ahead go as far again.
      EXPECT_LE(r.served, r.part + 2 * r.twice + std::max(base, r.part / kAheadPerShown) + largest)
          << "a job reading " << share << " of the dataset" << (twice ? ", large files twice" : "");
      EXPECT_GE(r.served, r.part);
    }
  // Reading the whole dataset, readers find far more of it copied ahead than
  // the setting's window alone let them.
  Reading grown = read_part(sizes, 1.0, base, false),
          fixed = read_part(sizes, 1.0, base, false, true);
  EXPECT_EQ(grown.served, total) << "each file once";
  EXPECT_GT(grown.found, 2 * fixed.found) << grown.found << " bytes found copied ahead, "
                                          << fixed.found << " with the setting's window only";
}

}  // namespace
}  // namespace monarch
