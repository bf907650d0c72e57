#include "resolve.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace monarch {
namespace {

// This process's threads now (/proc/self/status).
int threads_now() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  return -1;
}

// Far more names than lookup threads (numeric and /etc/hosts names: no name
// server asked): every one is looked up, by at most kResolveThreads threads
// at once, seen by sampling the process's threads meanwhile.
TEST(ResolveNodes, ManyNamesAreLookedUpByABoundedNumberOfThreads) {
  std::vector<std::string> names;
  for (int i = 0; i < 1000; ++i)
    names.push_back("127.0." + std::to_string(i / 250) + "." + std::to_string(i % 250 + 1));
  names.push_back("localhost");
  int before = threads_now();
  ASSERT_GT(before, 0);
  std::atomic<bool> done{false};
  std::atomic<int> most{0};
  std::thread sampler([&] {
    while (!done) {
      int n = threads_now();
      if (n > most) most = n;
    }
  });
  auto found = resolve_nodes(names, 60000);
  done = true;
  sampler.join();
  ASSERT_EQ(found.size(), names.size());
  EXPECT_EQ(found["127.0.3.250"], "127.0.3.250");
  EXPECT_EQ(found["localhost"], "127.0.0.1");
  EXPECT_LE(most.load(), before + 1 + int(kResolveThreads)) << "the sampler, the lookups";
}

TEST(ResolveNodes, NoNamesNoWait) {
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(resolve_nodes({}, 60000).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

}  // namespace
}  // namespace monarch
