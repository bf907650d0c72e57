#include <gtest/gtest.h>

#include "placement.h"

namespace monarch {
namespace {

TEST(Placement, FillsTopDownWithoutEviction) {
  uint64_t free_space[2] = {1 << 30, 1 << 30};
  Placement p(
      {{10000, 1000}, {5000, 1000}}, [&](int t) { return free_space[t]; }, 0);
  EXPECT_EQ(p.reserve(4000), 0);
  EXPECT_EQ(p.reserve(4000), 0);
  EXPECT_EQ(p.reserve(4000), 1);   // tier 0 would exceed its quota: next tier
  EXPECT_EQ(p.reserve(1500), 0);   // a smaller file still fits on tier 0 (2000 of 10000 left)
  EXPECT_EQ(p.reserve(1500), -1);  // neither: nothing is evicted
  EXPECT_EQ(p.used(0), 10000u);
  EXPECT_EQ(p.used(1), 4000u);
  EXPECT_EQ(p.room(0), 0u);
  EXPECT_EQ(p.room(1), 1000u) << "the quota left";
}

TEST(Placement, CountsWholeBlocks) {
  Placement p(
      {{8192, 4096}}, [](int) { return 1ull << 30; }, 0);
  EXPECT_EQ(p.footprint(0, 1), 4096u);
  EXPECT_EQ(p.footprint(0, 0), 0u);
  EXPECT_EQ(p.reserve(1), 0);
  EXPECT_EQ(p.reserve(4097), -1);  // 2 blocks: 12 KiB > 8 KiB
  EXPECT_EQ(p.reserve(4096), 0);
}

TEST(Placement, RespectsRealFreeSpaceAndInflightCopies) {
  uint64_t free_space = 10000;
  Placement p(
      {{1 << 30, 1}}, [&](int) { return free_space; }, 1000);
  EXPECT_EQ(p.room(0), 9000u) << "the file system's free space, less the reserve, under the quota";
  EXPECT_EQ(p.reserve(5000), 0);  // 5000 + 1000 reserve <= 10000
  EXPECT_EQ(p.room(0), 4000u) << "less what is in flight";
  EXPECT_EQ(p.reserve(4500), -1);  // 5000 in flight + 4500 + 1000 > 10000
  p.written(0, 5000);              // now on disk: the file system shows it
  free_space = 5000;
  EXPECT_EQ(p.reserve(4000), 0);
  p.release(0, 4000);  // abandoned copy
  EXPECT_EQ(p.used(0), 5000u);
  p.mark_full(0);
  EXPECT_EQ(p.reserve(1), -1);
  EXPECT_TRUE(p.full(0));
}

TEST(Placement, TiersOnOneFileSystemShareItsRoom) {
  // Two tiers on one file system (7) of 10000 bytes free, less 1000 kept free.
  uint64_t free_space = 10000;
  auto free_bytes = [&](int) { return free_space; };
  Placement p({{6000, 1, 7}, {6000, 1, 7}}, free_bytes, 1000);
  EXPECT_EQ(p.room(0), 6000u) << "its quota, within the free space";
  EXPECT_EQ(p.room_all(), 9000u) << "together: the free space, once";
  Placement apart({{6000, 1}, {6000, 1}}, free_bytes, 1000);
  EXPECT_EQ(apart.room_all(), 12000u) << "file systems of their own (fs 0)";
  Placement small({{2000, 1, 7}, {3000, 1, 7}}, free_bytes, 1000);
  EXPECT_EQ(small.room_all(), 5000u) << "together: their quotas";
  // A copy in flight to one tier takes the free space of both.
  EXPECT_EQ(p.reserve(5000), 0);
  EXPECT_EQ(p.room(1), 4000u) << "the file system's free space less the copy in flight";
  EXPECT_EQ(p.room_all(), 4000u);
  EXPECT_EQ(p.reserve(4500), -1) << "5000 in flight + 4500 + 1000 > 10000 on one file system";
  // The room kept for files homed here counts the file system once.
  Placement q({{6000, 1, 7}, {6000, 1, 7}}, free_bytes, 1000);
  EXPECT_EQ(q.reserve(3000, 6001), -1) << "9000 - 3000 < 6001";
  EXPECT_EQ(q.reserve(3000, 6000), 0);
}

TEST(Placement, AdoptedCopiesCount) {
  Placement p(
      {{1000, 1}}, [](int) { return 1ull << 30; }, 0);
  p.adopt(0, 800);
  EXPECT_EQ(p.reserve(300), -1);
  EXPECT_EQ(p.reserve(200), 0);
}

}  // namespace
}  // namespace monarch

namespace monarch {
namespace {

TEST(Placement, KeepsRoomForTheFilesHomedHere) {
  Placement p(
      {{10000, 1000}, {5000, 1000}}, [](int) { return 1ull << 30; }, 0);
  EXPECT_EQ(p.reserve(4000, 9000), 0);   // 15000 of room: 11000 left, 9000 kept
  EXPECT_EQ(p.reserve(3000, 9000), -1);  // 8000 would be left
  EXPECT_EQ(p.reserve(6000), 0);         // a file homed here takes the kept room
  EXPECT_EQ(p.reserve(1000, 5000), -1);
  EXPECT_EQ(p.reserve(1000, 4000), 1);
}

}  // namespace
}  // namespace monarch
