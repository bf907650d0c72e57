// The copier publishing copies under folders: real files, a real walk, real
// copy threads (no peers, no stage-ahead: each copy is asked for by place()).
#include "copier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "counters.h"
#include "index.h"
#include "placement.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;

// One node's copier over `root`, copying to the job directory `tier`.
struct Node {
  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  fs::path tier;
  MappedMap map;
  int root_fd = -1, tier_fd = -1;
  std::unique_ptr<Placement> placement;
  std::unique_ptr<Copier> copier;

  Node(const fs::path& root, const fs::path& tier_dir) : tier(tier_dir) {
    fs::create_directories(tier / kTmpDir);
    fs::create_directories(tier / kDataDir);
    root_fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    tier_fd = open(tier.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    IndexStats st;
    map = build_index({.root = root.string(),
                       .out_path = (tier / "index").string(),
                       .tier_dirs = {tier.string()},
                       .stall_ns = 200'000'000,
                       .generation = 1},
                      st, [](JobMap&) {});
    placement = std::make_unique<Placement>(
        std::vector<Placement::Tier>{{64 << 20, 4096}}, [](int) { return uint64_t(1) << 30; }, 0);
    copier = std::make_unique<Copier>(map.map(), *placement,
                                      CopierOptions{.root_fd = root_fd,
                                                    .tier_fds = {tier_fd},
                                                    .block_sizes = {1 << 20},
                                                    .threads = 2,
                                                    .stage_ahead = false,
                                                    .fast_fs_check = false},
                                      counters);
    copier->start();
  }
  ~Node() {
    copier->stop();
    copier.reset();
    close(root_fd);
    close(tier_fd);
  }

  // Asks for the copy of `rel` and waits for its end (at most 60 s, a loaded
  // machine's bound): the file's state then, kCached when it was published.
  FileState copy(const std::string& rel) {
    int64_t id = map.map().find(rel);
    EXPECT_GE(id, 0) << rel << " is not in the index";
    if (id < 0) return kFailed;
    copier->place(uint32_t(id));
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      FileState s = map.map().state(uint32_t(id)).state;
      if (s != kQueued && s != kCopying) return s;
      if (std::chrono::steady_clock::now() > deadline) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::string published(const std::string& rel) const {
    std::ifstream in(tier / kDataDir / rel);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};

class CopierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/monarch-copier-XXXXXX";
    dir = mkdtemp(name);
    root = dir / "ds";
    for (const char* rel : {"a/b/x", "a/b/y", "a/z", "top"}) {
      fs::create_directories((root / rel).parent_path());
      std::ofstream(root / rel) << "bytes of " << rel;
    }
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir, root;
};

// Two copiers in one process (a test's two nodes, a stager started again),
// each on its tier 0, copy the same folders: both publish.
TEST_F(CopierTest, TwoCopiersInOneProcessBothMakeTheirFolders) {
  Node one(root, dir / "tier-1"), two(root, dir / "tier-2");
  for (Node* node : {&one, &two})
    for (const char* rel : {"a/b/x", "a/z", "top"}) {
      EXPECT_EQ(node->copy(rel), kCached) << rel << " on " << node->tier;
      EXPECT_EQ(node->published(rel), std::string("bytes of ") + rel);
    }
  EXPECT_EQ(one.counters[s_copy_errors].load() + two.counters[s_copy_errors].load(), 0u);
}

// The job removes a folder of its tier (its copies with it): the next copy
// under that folder makes it again, and the data folder too.
TEST_F(CopierTest, AFolderRemovedUnderTheCopierIsMadeAgain) {
  Node node(root, dir / "tier");
  ASSERT_EQ(node.copy("a/b/x"), kCached);
  fs::remove_all(node.tier / kDataDir / "a");
  EXPECT_EQ(node.copy("a/b/y"), kCached);
  EXPECT_EQ(node.published("a/b/y"), "bytes of a/b/y");
  fs::remove_all(node.tier / kDataDir);
  EXPECT_EQ(node.copy("a/z"), kCached);
  EXPECT_EQ(node.published("a/z"), "bytes of a/z");
  EXPECT_EQ(node.counters[s_copy_errors].load(), 0u);
}

}  // namespace
}  // namespace monarch
