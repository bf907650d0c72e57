#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "index.h"
#include "sanitized.h"

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
  if (!kSanitized) {
    EXPECT_LE(peak - before, map_kib + 4096) << "the walk's memory beside the map, KiB";
  }
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

// lstat of `rel` below the directory `dir_fd`, one component at a time (a
// path may be longer than PATH_MAX).
int lstat_below(int dir_fd, const std::string& rel, struct stat* st) {
  int fd = dup(dir_fd);
  size_t at = 0;
  for (size_t slash; fd >= 0 && (slash = rel.find('/', at)) != std::string::npos; at = slash + 1) {
    int next = openat(fd, rel.substr(at, slash - at).c_str(),
                      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    fd = next;
  }
  if (fd < 0) return -1;
  int r = fstatat(fd, rel.c_str() + at, st, AT_SYMLINK_NOFOLLOW);
  close(fd);
  return r;
}

// Creates the file `rel` (its directories too) below `dir_fd`, of `size`
// bytes (sparse), however long the path.
void make_below(int dir_fd, const std::string& rel, off_t size) {
  int fd = dup(dir_fd);
  size_t at = 0;
  for (size_t slash; (slash = rel.find('/', at)) != std::string::npos; at = slash + 1) {
    std::string comp = rel.substr(at, slash - at);
    mkdirat(fd, comp.c_str(), 0755);
    int next = openat(fd, comp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(fd);
    ASSERT_GE(next, 0) << rel;
    fd = next;
  }
  int f = openat(fd, rel.c_str() + at, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  close(fd);
  ASSERT_GE(f, 0) << rel << ": " << std::strerror(errno);
  ASSERT_EQ(ftruncate(f, size), 0);
  close(f);
}

// Every entry of `m` is the file at its path below `root_fd` (identity, size,
// times), the entries are in strictly increasing path order, and every path
// and identity leads back to its entry. `want`: the files that must be there
// with their sizes (all of them, unless `subset`).
void expect_exact(const JobMap& m, int root_fd, const std::map<std::string, uint64_t>& want,
                  bool subset = false) {
  ASSERT_EQ(m.why(), "");
  if (!subset) {
    ASSERT_EQ(m.size(), want.size());
  }
  uint64_t bad = 0;
  for (uint32_t i = 0; i < m.size() && bad < 10; ++i) {
    std::string_view p = m.path(i);
    std::string ps(p);
    auto w = want.find(ps);
    bool ok = !p.empty() && w != want.end() && m.entry(i).size == w->second;
    if (i > 0) ok = ok && m.path(i - 1) < p;  // sorted, no duplicates
    ok = ok && m.find(p) == int64_t(i);
    struct stat st;
    ok = ok && lstat_below(root_fd, ps, &st) == 0;
    const Entry& e = m.entry(i);
    ok = ok && st.st_ino == e.ino && uint64_t(st.st_size) == e.size &&
         to_ns(st.st_mtim) == e.mtime_ns && to_ns(st.st_ctim) == e.ctime_ns &&
         to_ns(st.st_atim) == e.atime_ns;
    if (const Attr* a = m.attr(i))
      ok = ok && a->dev == uint64_t(st.st_dev) && a->uid == st.st_uid && a->mode == st.st_mode &&
           m.same_version(i, st);
    else
      ok = ok && e.attr == kNoAttr;
    bool by_inode = false;
    m.for_each_inode(st.st_dev, st.st_ino, [&](uint32_t f) { by_inode = by_inode || f == i; });
    ok = ok && by_inode;
    if (!ok) {
      ++bad;
      ADD_FAILURE() << "entry " << i << " (" << ps.size() << " bytes: " << ps.substr(0, 60)
                    << ") is not its file";
    }
  }
}

// Paths that fill the walk's 1 MiB chunks of names exactly, paths that leave
// a gap at their end, more records than a chunk holds in one directory (one
// walk thread), bytes past 0x7f and below '/', a path longer than PATH_MAX:
// every entry is its own file, in path order.
TEST(Index, EveryEntryIsItsOwnFileWhateverItsPath) {
  TempDir d;
  fs::path root = d.path / "ds";
  fs::create_directories(root);
  int root_fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(root_fd, 0);
  std::map<std::string, uint64_t> want;
  uint64_t size = 0;
  auto add = [&](const std::string& rel) {
    make_below(root_fd, rel, off_t(++size));
    want[rel] = size;
  };
  // 256-byte paths: 4096 to a chunk, exactly. 17,000 > the 16,384 records of
  // a chunk.
  for (int i = 0; i < 17000; ++i) {
    std::string name = std::to_string(i) + "_";
    add("d/" + name + std::string(254 - name.size(), char('a' + i % 26)));
  }
  // 255-byte paths with bytes past 0x7f: 16 bytes left at each chunk's end.
  for (int i = 0; i < 9000; ++i) {
    std::string name = std::to_string(i) + "\xc3\xa9";
    add("e/" + name + std::string(253 - name.size(), char(0x80 + i % 0x7f)));
  }
  // Lengths 1 to 255, and names that sort around '/' (" ", "-", ".", "0").
  for (int i = 0; i < 3000; ++i) {
    std::string name = std::to_string(i) + "_";
    size_t len = 1 + (i * 7919u) % 255;
    if (name.size() < len) name += std::string(len - name.size(), "-. 0~\x7f\xff"[i % 7]);
    add("f/" + name);
  }
  for (const char* rel : {"x", "x-", "x.y", "x0", "x\xff", "y/x", "y-/x", "y.z/x", "y0/x", "z"})
    add(rel);
  // A file whose path is longer than PATH_MAX (its directory's is not), and
  // a directory too deep to open by one path (its file is not indexed).
  std::string deep;
  while (deep.size() < 3800) deep += std::string(250, char('A' + deep.size() / 251)) + "/";
  add(deep + std::string(255, 'L'));
  std::string too_deep = deep + std::string(255, 'M') + "/" + std::string(100, 'N');
  make_below(root_fd, too_deep + "/unseen", 1);

  IndexOptions o{.root = root.string(), .out_path = (d.path / "index").string()};
  IndexStats stats;
  MappedMap mm = build_index(o, stats, [](JobMap&) {});
  EXPECT_EQ(stats.files, want.size());
  EXPECT_EQ(stats.unreadable, 1u);  // too_deep
  expect_exact(mm.map(), root_fd, want);
  int64_t long_one = mm.map().find(deep + std::string(255, 'L'));
  ASSERT_GE(long_one, 0);
  EXPECT_GT(mm.map().path(uint32_t(long_one)).size(), size_t(PATH_MAX));
  // The files below a directory are one run (the client's prefix runs).
  const JobMap& m = mm.map();
  for (const char* dir : {"x", "y", "d", "e", "f"}) {
    std::string pre = std::string(dir) + "/";
    uint64_t first = m.size(), n = 0;
    for (uint64_t i = 0; i < m.size(); ++i)
      if (m.path(uint32_t(i)).starts_with(pre)) {
        if (first == m.size()) first = i;
        EXPECT_EQ(i, first + n++) << pre;
      }
  }
  close(root_fd);
}

TEST(Index, EmptyDatasetAndDirectoriesWithoutFiles) {
  TempDir d;
  fs::path root = d.path / "ds";
  fs::create_directories(root / "a/b/c");
  fs::create_directories(root / "d");
  IndexOptions o{.root = root.string(), .out_path = (d.path / "index").string()};
  IndexStats stats;
  MappedMap mm = build_index(o, stats, [](JobMap&) {});
  EXPECT_EQ(mm.map().why(), "");
  EXPECT_EQ(mm.map().size(), 0u);
  EXPECT_EQ(mm.map().dirs(), 4u);
  EXPECT_EQ(mm.map().find("a/b"), -1);
  EXPECT_EQ(mm.map().find(""), -1);
  EXPECT_GE(mm.map().find_dir("a/b/c"), 0);
  MappedMap again = open_index(o.out_path);
  EXPECT_EQ(again.map().why(), "");

  fs::remove_all(root / "a");
  fs::remove_all(root / "d");
  MappedMap none = build_index(o, stats, [](JobMap&) {});
  EXPECT_EQ(none.map().why(), "");
  EXPECT_EQ(none.map().size(), 0u);
  EXPECT_EQ(none.map().dirs(), 0u);
}

// A walk stopped midway publishes the files it found, each exactly.
TEST(Index, AStoppedWalkHoldsOnlyExactEntries) {
  TempDir d;
  fs::path root = d.path / "ds";
  fs::create_directories(root);
  int root_fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  std::map<std::string, uint64_t> want;
  for (int i = 0; i < 20000; ++i) {
    std::string rel =
        "c" + std::to_string(i % 40) + "/" + std::to_string(i) + std::string(i % 200, 'p');
    make_below(root_fd, rel, i);
    want[rel] = i;
  }
  std::atomic<bool> stop{false};
  IndexOptions o{.root = root.string(),
                 .out_path = (d.path / "index").string(),
                 .index_rate = 40000,  // half a second
                 .stop = &stop};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    stop = true;
  });
  IndexStats stats;
  MappedMap mm = build_index(o, stats, [](JobMap&) {});
  stopper.join();
  EXPECT_TRUE(stats.stopped);
  // Paced, the whole walk takes 0.4 s at least; on a busy machine the walk's
  // threads (at the lowest priority) may not have found anything yet.
  EXPECT_LT(stats.files, want.size());
  std::printf("stopped walk: %llu of %zu files\n", (unsigned long long)stats.files, want.size());
  expect_exact(mm.map(), root_fd, want, true);

  IndexStats none;
  MappedMap empty = build_index(o, none, [](JobMap&) {});  // stopped from the start
  EXPECT_TRUE(none.stopped);
  EXPECT_EQ(empty.map().size(), 0u);
  EXPECT_EQ(empty.map().why(), "");
  close(root_fd);
}

// `files` files of one byte in `dirs` folders of d/ds; returns d/ds.
fs::path one_byte_files(const fs::path& d, int files, int dirs) {
  fs::path root = d / "ds";
  fs::create_directories(root);
  int root_fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  for (int i = 0; i < files; ++i)
    make_below(root_fd, "c" + std::to_string(i % dirs) + "/" + std::to_string(i), 1);
  close(root_fd);
  return root;
}

// The walk starts slowly (index.cpp, Pace): stopped 30 ms after it began,
// an unpaced walk of local files, which makes thousands of calls in that time
// at full speed, has made at most the slow start's calls until the stop
// (2,000 a second doubling every 10 ms: ~200 in 30 ms), with 10 ms of
// catching up and the turns its 16 threads had taken.
TEST(Index, TheWalkStartsSlowly) {
  TempDir d;
  fs::path root = one_byte_files(d.path, 20000, 20);
  std::atomic<bool> stop{false};
  IndexOptions o{.root = root.string(), .out_path = (d.path / "index").string(), .stop = &stop};
  auto start = std::chrono::steady_clock::now();
  double stopped_after = 0;  // seconds
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    stop = true;
    stopped_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  IndexStats stats;
  MappedMap mm = build_index(o, stats, [](JobMap&) {});
  stopper.join();
  EXPECT_TRUE(stats.stopped);
  double t = stopped_after + 0.010;
  double bound = 2000 * 0.010 / std::log(2.0) * (std::exp2(t / 0.010) - 1) + 16 + 50;
  EXPECT_LT(double(stats.metadata_calls), bound) << "stopped after " << stopped_after << " s";
  std::printf("walk stopped after %.1f ms: %llu metadata calls (at most %.0f)\n",
              stopped_after * 1000, (unsigned long long)stats.metadata_calls, bound);
  // Unstopped, the same walk finds every file.
  IndexStats all;
  MappedMap whole =
      build_index(IndexOptions{.root = root.string(), .out_path = (d.path / "index").string()}, all,
                  [](JobMap&) {});
  EXPECT_EQ(all.files, 20000u);
  EXPECT_FALSE(all.stopped);
}

// A paced walk keeps to its index_rate over the whole walk (its turns are
// one gap apart; one that fell behind catches up by 10 ms at most).
TEST(Index, APacedWalkKeepsItsRate) {
  TempDir d;
  fs::path root = one_byte_files(d.path, 3000, 10);
  IndexStats stats;
  MappedMap mm = build_index(
      IndexOptions{
          .root = root.string(), .out_path = (d.path / "index").string(), .index_rate = 10000},
      stats, [](JobMap&) {});
  EXPECT_EQ(stats.files, 3000u);
  double rate = double(stats.metadata_calls) / stats.seconds;
  EXPECT_LE(rate, 10000 * 1.02) << stats.metadata_calls << " calls in " << stats.seconds << " s";
  std::printf("paced walk: %llu calls in %.3f s, %.0f a second\n",
              (unsigned long long)stats.metadata_calls, stats.seconds, rate);
}

// More kinds of attributes than the table holds (kNoAttr entries), on two
// devices: every entry is still exact and found by its path and identity.
// (The device barely moves a bucket of the identity table, so this cannot see
// a kNoAttr entry given another's device.) Needs root: chown, a tmpfs mount.
TEST(Index, AttributeKindsPastTheTableOnTwoDevices) {
  TempDir d;
  fs::path root = d.path / "ds";
  fs::create_directories(root / "mnt");
  if (mount("monarch-test", (root / "mnt").c_str(), "tmpfs", 0, "mode=0755") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs: " << std::strerror(errno);
  struct Unmount {
    fs::path p;
    ~Unmount() { umount2(p.c_str(), MNT_DETACH); }
  } unmount{root / "mnt"};
  int root_fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  std::map<std::string, uint64_t> want;
  const int kinds = 70000;  // > kNoAttr
  for (int i = 0; i < kinds; ++i) {
    std::string rel =
        (i % 2 ? "mnt/" : "") + std::string("k") + std::to_string(i % 64) + "/" + std::to_string(i);
    make_below(root_fd, rel, i);
    if (fchownat(root_fd, rel.c_str(), uid_t(200000 + i), gid_t(0), AT_SYMLINK_NOFOLLOW) != 0)
      GTEST_SKIP() << "cannot chown: " << std::strerror(errno);
    want[rel] = i;
  }
  IndexOptions o{.root = root.string(), .out_path = (d.path / "index").string()};
  IndexStats stats;
  MappedMap mm = build_index(o, stats, [](JobMap&) {});
  const JobMap& m = mm.map();
  EXPECT_EQ(m.header().attr_count, uint64_t(kNoAttr));
  uint64_t none[2] = {0, 0};
  for (uint32_t i = 0; i < m.size(); ++i)
    if (m.entry(i).attr == kNoAttr) none[m.path(i).starts_with("mnt/")]++;
  std::printf("entries without attributes: %llu on the root's device, %llu on the tmpfs\n",
              (unsigned long long)none[0], (unsigned long long)none[1]);
  EXPECT_EQ(none[0] + none[1], uint64_t(kinds - kNoAttr));
  expect_exact(m, root_fd, want);
  close(root_fd);
}

}  // namespace
}  // namespace monarch
