#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "index.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    char name[] = "/tmp/monarch-index-XXXXXX";
    path = mkdtemp(name);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write(const fs::path& p, size_t bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << std::string(bytes, 'x');
}

TEST(Index, FindsEveryRegularFileAndAnswersStat) {
  TempDir d;
  fs::path root = d.path / "ds";
  for (int c = 0; c < 5; ++c)
    for (int i = 0; i < 40; ++i)
      write(root / ("class" + std::to_string(c)) / ("f" + std::to_string(i)), c * 100 + i);
  write(root / "top", 7);
  fs::create_symlink(root / "top", root / "link");  // links are read from the PFS
  mkfifo((root / "fifo").c_str(), 0600);
  IndexOptions o{.root = root.string(),
                 .out_path = (d.path / "index").string(),
                 .tier_dirs = {"/t0"},
                 .generation = 42};
  IndexStats stats;
  bool published = false;
  MappedMap mm = build_index(o, stats, [&](JobMap& m) {
    EXPECT_FALSE(fs::exists(o.out_path)) << "published before before_publish ran";
    published = true;
  });
  ASSERT_TRUE(published);
  JobMap& m = mm.map();
  EXPECT_EQ(m.why(), "");
  EXPECT_EQ(stats.files, 201u);
  EXPECT_EQ(m.size(), 201u);
  EXPECT_EQ(stats.skipped, 2u);
  EXPECT_EQ(m.header().generation, 42u);
  EXPECT_STREQ(m.header().tier_dirs[0], "/t0");

  int64_t id = m.find("class3/f17");
  ASSERT_GE(id, 0);
  EXPECT_EQ(m.path(id), "class3/f17");
  EXPECT_EQ(m.entry(id).size, 317u);
  struct stat want, got;
  ASSERT_EQ(stat((root / "class3/f17").c_str(), &want), 0);
  ASSERT_TRUE(m.fill_stat(id, &got));
  EXPECT_EQ(got.st_ino, want.st_ino);
  EXPECT_EQ(got.st_dev, want.st_dev);
  EXPECT_EQ(got.st_mode, want.st_mode);
  EXPECT_EQ(got.st_size, want.st_size);
  EXPECT_EQ(got.st_blocks, want.st_blocks);
  EXPECT_EQ(got.st_mtim.tv_nsec, want.st_mtim.tv_nsec);
  EXPECT_EQ(got.st_mtim.tv_sec, want.st_mtim.tv_sec);
  EXPECT_EQ(m.find("link"), -1);
  EXPECT_EQ(m.find("class3"), -1);
  ASSERT_GE(m.find("class3/f1"), 0);
  EXPECT_EQ(m.path(uint32_t(m.find("class3/f1"))), "class3/f1");
  // Directories, for path resolution: the real ones only, not links or files.
  EXPECT_EQ(m.dirs(), 5u);
  EXPECT_GE(m.find_dir("class3"), 0);
  EXPECT_EQ(m.find_dir("class3/f1"), -1);
  EXPECT_EQ(m.find_dir("link"), -1);
  // Files and directories by identity, for the job's changes.
  struct stat f1, c3;
  ASSERT_EQ(stat((root / "class3/f1").c_str(), &f1), 0);
  ASSERT_EQ(stat((root / "class3").c_str(), &c3), 0);
  EXPECT_EQ(m.find_inode(f1.st_dev, f1.st_ino), m.find("class3/f1"));
  EXPECT_EQ(m.find_inode(f1.st_dev + 1, f1.st_ino), -1);
  EXPECT_EQ(m.find_dir_inode(c3.st_dev, c3.st_ino), m.find_dir("class3"));
  EXPECT_TRUE(m.dataset_dev(f1.st_dev));
  EXPECT_EQ(m.find("nope"), -1);
  uint64_t total = 0;
  for (uint64_t i = 0; i < m.size(); ++i) {
    EXPECT_EQ(m.find(m.path(i)), int64_t(i));  // every path finds itself
    total += m.entry(i).size;
  }
  EXPECT_EQ(m.header().dataset_bytes, total);

  // A second mapping of the published file sees the same index.
  MappedMap again = open_index(o.out_path);
  EXPECT_EQ(again.map().find("class3/f17"), id);
}

TEST(Index, AboutOneHundredBytesPerFile) {
  TempDir d;
  fs::path root = d.path / "ds";
  const int files = 20000;
  for (int c = 0; c < 100; ++c) fs::create_directories(root / ("n0144076" + std::to_string(c)));
  for (int i = 0; i < files; ++i) {
    std::string dir = "n0144076" + std::to_string(i % 100);
    std::ofstream(root / dir / (dir + "_" + std::to_string(10000 + i) + ".JPEG"));
  }
  IndexOptions o{.root = root.string(), .out_path = (d.path / "index").string()};
  IndexStats stats;
  MappedMap mm = build_index(o, stats, [](JobMap&) {});
  const Header& h = mm.map().header();
  // ImageNet-like relative paths of ~30 bytes: entries, buckets and strings.
  double per_file = double(h.slots_off - h.entries_off) / files;
  EXPECT_LE(per_file, 100.0) << "bytes per file in the index";
  std::printf("index: %.1f bytes per file\n", per_file);
}

// Kilobytes of a "Vm...:" line of /proc/self/status.
long status_kib(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::atol(line.c_str() + std::strlen(key));
  return -1;
}

// The walk's records never take much beside the map they become: the peak
// RSS of a build is the map's size, within what does not grow with the
// dataset (walk threads' stacks). Before, it was 3.4-5.9 times the map.
TEST(Index, WalkMemoryIsTheMapsSize) {
  TempDir d;
  fs::path root = d.path / "ds";
  const int files = 100000;
  for (int c = 0; c < 100; ++c) {
    std::string dir = "n0144076" + std::to_string(c);
    fs::create_directories(root / dir);
    for (int i = 0; i < files / 100; ++i)
      ASSERT_EQ(mknod((root / dir / (dir + "_" + std::to_string(10000 + i) + ".JPEG")).c_str(),
                      S_IFREG | 0644, 0),
                0);
  }
  if (!(std::ofstream("/proc/self/clear_refs") << "5")) GTEST_SKIP() << "cannot reset VmHWM";
  long before = status_kib("VmRSS:");
  IndexOptions o{.root = root.string(), .out_path = (d.path / "index").string()};
  IndexStats stats;
  MappedMap mm = build_index(o, stats, [](JobMap&) {});
  long peak = status_kib("VmHWM:");
  ASSERT_EQ(stats.files, uint64_t(files));
  long map_kib = long(mm.bytes() / 1024);
  std::printf("index of %d files: peak RSS +%ld KiB, map %ld KiB\n", files, peak - before, map_kib);
  EXPECT_LE(peak - before, map_kib + 4096) << "the walk's memory beside the map, KiB";
}

TEST(Index, UnreadableRootIsAClearError) {
  IndexOptions o{.root = "/nonexistent/dataset", .out_path = "/tmp/x"};
  IndexStats stats;
  try {
    build_index(o, stats, [](JobMap&) {});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dataset"), std::string::npos);
  }
}

}  // namespace
}  // namespace monarch
