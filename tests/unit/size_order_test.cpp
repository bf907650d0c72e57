#include "size_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace monarch {
namespace {

std::vector<Entry> with_sizes(const std::vector<uint64_t>& sizes) {
  std::vector<Entry> e(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) e[i].size = sizes[i];
  return e;
}

// Every file the order gives, to its end.
std::vector<int64_t> walk(SizeOrder& o) {
  std::vector<int64_t> out;
  for (int64_t f; (f = o.current()) >= 0; o.advance()) out.push_back(f);
  return out;
}

TEST(SizeOrder, SmallerFirstPathOrderWithinAQuarterOfAPowerOfTwo) {
  auto e = with_sizes({5, 0, 1000, 3, 64, 0, 7, uint64_t(1) << 40, 4, 1023, 900, 70, 79, 80});
  SizeOrder o;
  o.reset(e.data(), e.size());
  // 0 B: 1, 5; 3, 4, 5, 7 B; [64, 80): 4, 11, 12; [80, 96): 13; [896, 1024): 2, 9, 10; 1 TiB.
  EXPECT_EQ(walk(o), (std::vector<int64_t>{1, 5, 3, 8, 0, 6, 4, 11, 12, 13, 2, 9, 10, 7}));
  EXPECT_TRUE(o.done());
  EXPECT_EQ(o.current(), -1) << "past the last file it stays there";
}

TEST(SizeOrder, ACursorNotAdvancedGivesTheSameFileAndRewindStartsOver) {
  auto e = with_sizes({10, 1, 100});
  SizeOrder o;
  o.reset(e.data(), e.size());
  EXPECT_EQ(o.current(), 1);
  EXPECT_EQ(o.current(), 1) << "a file held back (the stage-ahead window) is offered again";
  o.advance();
  EXPECT_EQ(o.current(), 0);
  o.rewind();
  EXPECT_EQ(walk(o), (std::vector<int64_t>{1, 0, 2}));
}

TEST(SizeOrder, MembersAndTheirComplementShareTheFilesOnce) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> sizes(20'000);
  for (auto& s : sizes) s = rng() >> (4 + rng() % 60);  // sizes over every class to 2^60
  auto e = with_sizes(sizes);
  std::vector<bool> own(e.size());
  for (size_t i = 0; i < own.size(); ++i) own[i] = rng() % 3 == 0;
  SizeOrder mine, others;
  mine.reset(e.data(), e.size(), own);
  own.flip();
  others.reset(e.data(), e.size(), own);
  std::vector<int> seen(e.size());
  for (SizeOrder* o : {&mine, &others}) {
    uint64_t largest = 0;  // of the files before
    for (int64_t f : walk(*o)) {
      ++seen[f];
      EXPECT_EQ(o == &mine, !own[f]) << "file " << f << " in the wrong order";
      EXPECT_LE(largest * 4, e[f].size * 5)
          << "file " << f << " of " << e[f].size << " bytes after one of " << largest;
      largest = std::max(largest, e[f].size);
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "file " << i;
}

TEST(SizeOrder, NoFilesNoMembers) {
  SizeOrder o;
  EXPECT_EQ(o.current(), -1) << "before reset";
  o.reset(nullptr, 0);
  EXPECT_EQ(o.current(), -1);
  EXPECT_TRUE(o.done());
  auto e = with_sizes({1, 2, 3});
  o.reset(e.data(), e.size(), std::vector<bool>(3, false));
  EXPECT_EQ(o.current(), -1);
}

}  // namespace
}  // namespace monarch
