#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "home.h"

namespace monarch {
namespace {

std::string file(int i) {
  return "train/class" + std::to_string(i % 1000) + "/img" + std::to_string(i) + ".jpg";
}

TEST(Homes, SharesFollowTheWeights) {
  Homes h({{"node1", 1}, {"node2", 1}, {"node3", 2}});
  int count[3] = {};
  const int n = 100000;
  for (int i = 0; i < n; ++i) ++count[h.home(file(i))];
  EXPECT_NEAR(count[0] / double(n), 0.25, 0.01);
  EXPECT_NEAR(count[1] / double(n), 0.25, 0.01);
  EXPECT_NEAR(count[2] / double(n), 0.50, 0.01);
}

TEST(Homes, TheSameOnEveryNodeWhateverTheListsOrder) {
  Homes a({{"n1", 3}, {"n2", 1}, {"n3", 1}});
  Homes b({{"n3", 1}, {"n1", 3}, {"n2", 1}});
  for (int i = 0; i < 20000; ++i)
    ASSERT_EQ(a.node(a.home(file(i))).name, b.node(b.home(file(i))).name) << file(i);
}

TEST(Homes, AFailedNodeMovesOnlyItsOwnFiles) {
  Homes h({{"n1", 1}, {"n2", 1}, {"n3", 1}, {"n4", 1}});
  int moved = 0;
  std::map<int, int> to;
  for (int i = 0; i < 40000; ++i) {
    int before = h.home(file(i)), after = h.home(file(i), [](int n) { return n == 2; });
    ASSERT_NE(after, 2);
    if (before != 2) {
      ASSERT_EQ(before, after) << file(i) << " moved though its home did not fail";
    } else {
      ++moved;
      ++to[after];
    }
  }
  EXPECT_NEAR(moved / 40000.0, 0.25, 0.02);
  for (int n : {0, 1, 3}) EXPECT_NEAR(to[n] / double(moved), 1 / 3.0, 0.03) << "n" << n + 1;
  // A node missing from the list homes the same files as one excluded.
  Homes without({{"n1", 1}, {"n2", 1}, {"n4", 1}});
  for (int i = 0; i < 5000; ++i)
    ASSERT_EQ(without.node(without.home(file(i))).name,
              h.node(h.home(file(i), [](int n) { return n == 2; })).name);
}

TEST(Homes, EveryNodeExcludedIsNoHome) {
  Homes h({{"a", 1}, {"b", 1}});
  EXPECT_EQ(h.home("x", [](int) { return true; }), -1);
  EXPECT_EQ(h.home("x", [](int n) { return n == 0; }), 1);
  EXPECT_EQ(h.home("x", [](int n) { return n == 1; }), 0);
}

TEST(Homes, BadNodesSayWhich) {
  auto message = [](std::vector<Homes::Node> nodes) {
    try {
      Homes h(std::move(nodes));
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message({{"a", 1}, {"a", 2}}).find("'a' is listed twice"), std::string::npos);
  EXPECT_NE(message({{"a", 0}}).find("'a' has weight 0"), std::string::npos);
  EXPECT_NE(message({{"", 1}}).find("empty name"), std::string::npos);
}

TEST(BalanceHomes, BytesWithinTheLargestFileWhateverTheSizes) {
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 24; ++i) sizes.push_back(uint64_t(4 + (i * 7) % 21) << 20);  // shards
  for (int i = 0; i < 2000; ++i) sizes.push_back(uint64_t(16 + (i * 37) % 240) << 10);
  std::vector<uint16_t> h = balance_homes(sizes, 3);
  uint64_t bytes[3] = {}, largest = 24 << 20;
  for (size_t i = 0; i < sizes.size(); ++i) bytes[h[i]] += sizes[i];
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b) EXPECT_LE(bytes[a], bytes[b] + largest) << a << " " << b;
  EXPECT_EQ(balance_homes(sizes, 3), h) << "every node computes the same";
  // Rendezvous by name alone puts whole shards where they fall: further apart.
  Homes hrw({{"vm-n1", 1}, {"vm-n2", 1}, {"vm-n3", 1}});
  uint64_t by_name[3] = {};
  for (size_t i = 0; i < sizes.size(); ++i) by_name[hrw.home(file(int(i)))] += sizes[i];
  auto spread = [](const uint64_t* b) {
    return *std::max_element(b, b + 3) - *std::min_element(b, b + 3);
  };
  EXPECT_LT(spread(bytes), spread(by_name));
}

}  // namespace
}  // namespace monarch
