#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "index_wire.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;

struct Walked {
  fs::path dir, root;
  MappedMap map;
  std::string wire;
  Walked() {
    char name[] = "/tmp/monarch-wire-XXXXXX";
    dir = mkdtemp(name);
    root = dir / "ds";
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 30; ++i) {
        fs::path p = root / ("class" + std::to_string(c)) / ("f" + std::to_string(i));
        fs::create_directories(p.parent_path());
        std::ofstream(p) << std::string(c * 100 + i, 'x');
      }
    IndexOptions o{.root = root.string(),
                   .out_path = (dir / "walked").string(),
                   .tier_dirs = {"/walker/t0"},
                   .generation = 1};
    IndexStats st;
    map = build_index(o, st, [](JobMap& m) { m.entry(0).state.store(make_state(kCached)); });
    wire = index_wire(map.map());
  }
  ~Walked() { fs::remove_all(dir); }
  IndexOptions here(const char* name) const {
    return {.root = root.string(),
            .out_path = (dir / name).string(),
            .tier_dirs = {"/here/t0", "/here/t1"},
            .consistency = 1,
            .small_file_max = 4096,
            .generation = 77};
  }
  // The wire form as if the walking node numbered the dataset's device `dev`.
  std::string renumbered(uint64_t dev, bool one_dir_elsewhere = false) const {
    std::string w = wire;
    auto* h = reinterpret_cast<Header*>(w.data());
    h->root_dev = dev;
    auto* attrs = reinterpret_cast<Attr*>(w.data() + h->attrs_off);
    for (uint64_t i = 0; i < h->attr_count; ++i) attrs[i].dev = dev;
    auto* dirs = reinterpret_cast<DirEntry*>(w.data() + h->dirs_off);
    for (uint64_t i = 0; i < h->dir_count; ++i) dirs[i].dev = dev;
    if (one_dir_elsewhere) dirs[0].dev = dev + 1;
    return w;
  }
};

std::string error_of(const Walked& w, std::string_view wire, const IndexOptions& o) {
  IndexStats st;
  try {
    build_index_from(o, wire, st, [](JobMap&) {});
  } catch (const std::runtime_error& e) {
    EXPECT_FALSE(fs::exists(o.out_path)) << "published though it failed";
    return e.what();
  }
  return "";
}

TEST(IndexWire, AnotherNodesMapAnswersAsTheWalkersWithItsOwnSettings) {
  Walked w;
  EXPECT_LT(w.wire.size(), w.map.bytes()) << "the counters' slots are not sent";
  IndexStats st;
  bool before = false;
  MappedMap got = build_index_from(w.here("index"), w.wire, st, [&](JobMap&) { before = true; });
  EXPECT_TRUE(before);
  ASSERT_TRUE(fs::exists(w.dir / "index"));
  JobMap& a = w.map.map();
  JobMap& b = got.map();
  ASSERT_EQ(b.why(), "");
  EXPECT_EQ(st.files, 120u);
  EXPECT_EQ(b.size(), a.size());
  EXPECT_EQ(b.header().generation, 77u);
  EXPECT_EQ(b.tiers(), 2u);
  EXPECT_STREQ(b.tier_dir(1), "/here/t1");
  EXPECT_EQ(b.consistency(), 1u);
  EXPECT_EQ(b.small_file_max(), 4096u);
  EXPECT_EQ(b.header().heartbeat_ns.load(), 0u);
  for (uint32_t i = 0; i < b.size(); ++i) {
    ASSERT_EQ(b.path(i), a.path(i));
    ASSERT_EQ(b.find(a.path(i)), int64_t(i));
    ASSERT_EQ(b.state(i).state, kNone) << "the walker's copies are not this node's";
    struct stat sa, sb;
    ASSERT_TRUE(a.fill_stat(i, &sa) && b.fill_stat(i, &sb));
    ASSERT_EQ(std::memcmp(&sa, &sb, sizeof sa), 0) << a.path(i);
  }
  EXPECT_GE(b.find_dir("class2"), 0);
}

// A map gives one wire form whatever its node does meanwhile: its live
// words are not in it, and each chunk stays as given while its consumer
// writes it and hashes it (a walker whose copies changed a file's state
// between the two sent an index that did not match its own SHA-256).
TEST(IndexWire, OneWireFormWhateverTheLiveWordsDo) {
  Walked w;
  JobMap& m = w.map.map();
  std::atomic<bool> stop{false};
  std::thread changes([&] {
    for (uint32_t k = 0; !stop; ++k) {
      for (uint32_t i = 0; i < m.size(); ++i)
        m.entry(i).state.store(make_state(k % 2 ? kCached : kCopying));
      for (uint32_t i = 0; i < m.header().dir_count; ++i) m.dir(i).stale.store(k % 2);
    }
  });
  std::string got;
  bool stayed = true;
  index_wire_chunks(m, [&](const char* p, size_t n) {
    std::string first(p, n);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stayed = stayed && std::string(p, n) == first;
    got.append(p, n);
  });
  stop = true;
  changes.join();
  EXPECT_TRUE(stayed) << "a chunk changed while its consumer held it";
  EXPECT_EQ(got, w.wire) << "the wire form holds the node's live words";
}

TEST(IndexWire, DevicesRenumberedToThisNodes) {
  Walked w;
  struct stat root, f;
  ASSERT_EQ(stat(w.root.c_str(), &root), 0);
  ASSERT_EQ(stat((w.root / "class1/f3").c_str(), &f), 0);
  IndexStats st;
  MappedMap got =
      build_index_from(w.here("index"), w.renumbered(root.st_dev + 1000), st, [](JobMap&) {});
  JobMap& b = got.map();
  ASSERT_EQ(b.why(), "");
  int64_t id = b.find("class1/f3");
  ASSERT_GE(id, 0);
  struct stat s;
  ASSERT_TRUE(b.fill_stat(uint32_t(id), &s));
  EXPECT_EQ(s.st_dev, root.st_dev);
  EXPECT_EQ(b.find_inode(root.st_dev, f.st_ino), id) << "files by identity, renumbered";
  EXPECT_EQ(b.find_inode(root.st_dev + 1000, f.st_ino), -1);
  EXPECT_TRUE(b.dataset_dev(root.st_dev));
  EXPECT_EQ(b.find_dir_inode(root.st_dev, root.st_ino), JobMap::kRootDir);
}

TEST(IndexWire, WhatCannotServeThisNodeSaysWhy) {
  Walked w;
  struct stat root;
  ASSERT_EQ(stat(w.root.c_str(), &root), 0);
  EXPECT_NE(error_of(w, w.renumbered(root.st_dev + 5, true), w.here("a")).find("several devices"),
            std::string::npos);
  EXPECT_NE(error_of(w, std::string_view(w.wire).substr(0, w.wire.size() - 8), w.here("b"))
                .find("truncated"),
            std::string::npos);
  EXPECT_NE(error_of(w, "MONARCH", w.here("c")).find("not a Monarch index"), std::string::npos);
  IndexOptions other = w.here("d");
  other.root = (w.dir / "elsewhere").string();
  EXPECT_NE(error_of(w, w.wire, other).find("of another dataset"), std::string::npos);
  std::string bad = w.wire;
  reinterpret_cast<Header*>(bad.data())->entries_off = bad.size() - 8;  // a table past the end
  EXPECT_NE(error_of(w, bad, w.here("e")).find("damaged"), std::string::npos);
}

}  // namespace
}  // namespace monarch
