// The interposition library's handlers, called in-process with a job map built
// in the test: no LD_PRELOAD, no stager. `pass` is the real call.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "client.h"
#include "fdtable.h"
#include "handlers.h"
#include "index.h"
#include "paths.h"
#include "process.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;

void write(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << bytes;
}

// A dataset, look-alikes outside it, a tier, and the job map the stager would publish.
class Handlers : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/monarch-handlers-XXXXXX";
    top = mkdtemp(name);
    ds = top / "ds";
    write(ds / "a.bin", "dataset a");
    write(ds / "b.bin", "dataset b!");
    write(ds / "sub/c.bin", "dataset c");
    write(top / "out/dir/x", "");
    write(top / "out/a.bin", "OUTSIDE a");
    fs::create_directory_symlink("../out/dir", ds / "linkdir");
    fs::create_directory_symlink(ds / "sub",
                                 top / "alias");  // a link from outside into the dataset
    job = top / "tier/monarch-t";
    fs::create_directories(job / "data");
    IndexOptions o{.root = ds.string(),
                   .out_path = (job / "index").string(),
                   .tier_dirs = {job.string()},
                   .small_file_max = 1 << 20,
                   .stall_ns = 200'000'000,
                   .generation = 7};
    IndexStats stats;
    mapped = build_index(o, stats, [](JobMap&) {});
    m = &mapped.map();
    real::resolve();
    P.map = nullptr;
    P.next_load_ns = 0;  // each test publishes a new map: load it now
    P.next_seek_ns = 0;
    ASSERT_TRUE(init_process(ds.c_str(), job.c_str(), false));
    ASSERT_EQ(current_map()->size(), 3u);
    m = current_map();  // the library's own view
  }
  void TearDown() override {
    for_each_tracked([](int, FdEntry* e) { untrack(e); });
    P.enabled = false;
    P.map = nullptr;
    fs::remove_all(top);
  }

  // Marks `rel` cached on tier 0 with a copy holding `bytes`.
  void cache(const std::string& rel, const std::string& bytes) {
    write(job / "data" / rel, bytes);
    m->entry(uint32_t(m->find(rel))).state = make_state(kCached, 0);
  }

  Resolved at(const std::string& path, const std::string& cwd = "") {
    return resolve(*m, located().as_views(), path, cwd);
  }
  uint32_t id(const std::string& rel) { return uint32_t(m->find(rel)); }

  int open_(const std::string& path, int flags = O_RDONLY) {
    auto fn = [&] { return real::open(path.c_str(), flags); };
    return on_open(AT_FDCWD, path.c_str(), flags, 0, Pass<int>(fn));
  }
  std::string read_all(int fd) {
    std::string s(100, 0);
    auto fn = [&]() -> ssize_t { return real::read(fd, s.data(), s.size()); };
    ssize_t n = on_read(fd, s.data(), s.size(), 0, false, Pass<ssize_t>(fn));
    s.resize(n < 0 ? 0 : size_t(n));
    return s;
  }

  fs::path top, ds, job;
  MappedMap mapped;
  JobMap* m = nullptr;
};

// A directory renamed or removed makes every file below it stale, however
// its siblings' names sort: "sub-x/" and "sub.y/" come between "sub" and
// "sub/" (their run of files was missed when the search looked for "sub").
TEST(Client, AStaleDirectoryMarksEveryFileBelowIt) {
  char name[] = "/tmp/monarch-stale-dir-XXXXXX";
  fs::path top = mkdtemp(name), ds = top / "ds";
  for (const char* rel : {"a.bin", "sub/c.bin", "sub/d.bin", "sub-x/e.bin", "sub.y/f.bin"})
    write(ds / rel, "x");
  IndexOptions o{.root = ds.string(), .out_path = (top / "index").string()};
  IndexStats stats;
  MappedMap mm = build_index(o, stats, [](JobMap&) {});
  JobMap* map = &mm.map();
  mark_stale_dir(map, uint32_t(map->find_dir("sub")), Change::kNames);
  for (const char* rel : {"sub/c.bin", "sub/d.bin"})
    EXPECT_EQ(map->state(uint32_t(map->find(rel))).state, kStale) << rel;
  for (const char* rel : {"a.bin", "sub-x/e.bin", "sub.y/f.bin"})
    EXPECT_EQ(map->state(uint32_t(map->find(rel))).state, kNone) << rel;
  fs::remove_all(top);
}

TEST_F(Handlers, PathsResolveAsTheKernelDoes) {
  std::string d = ds.string();
  EXPECT_EQ(at(d + "/a.bin").where, Where::kFile);
  EXPECT_EQ(at(d + "/a.bin").id, id("a.bin"));
  EXPECT_EQ(at(d + "//sub/./c.bin").id, id("sub/c.bin"));
  EXPECT_EQ(at(d + "/sub/../a.bin").id, id("a.bin"));  // sub is a real, indexed directory
  EXPECT_EQ(at(d).where, Where::kDir);
  EXPECT_EQ(at(d + "/sub/").where, Where::kDir);
  // What the kernel refuses or resolves elsewhere is never a dataset file:
  EXPECT_EQ(at(d + "/a.bin/.").where, Where::kUnsure);            // ENOTDIR
  EXPECT_EQ(at(d + "/a.bin/").where, Where::kUnsure);             // ENOTDIR
  EXPECT_EQ(at(d + "/a.bin/../b.bin").where, Where::kUnsure);     // ENOTDIR
  EXPECT_EQ(at(d + "/nonexist/../a.bin").where, Where::kUnsure);  // ENOENT
  EXPECT_EQ(at(d + "/linkdir/../a.bin").where, Where::kUnsure);   // out/a.bin
  EXPECT_EQ(at(d + "/linkdir/x").where, Where::kUnsure);          // a link: the kernel follows it
  EXPECT_EQ(at(top.string() + "/out/../ds/a.bin").where, Where::kUnsure);  // ".." after a name
  EXPECT_EQ(at(top.string() + "/out/a.bin").where, Where::kOutside);
  // Relative paths start in the physical current directory.
  EXPECT_EQ(at("a.bin", d).id, id("a.bin"));
  EXPECT_EQ(at("c.bin", d + "/sub").id, id("sub/c.bin"));
  EXPECT_EQ(at("../a.bin", d + "/sub").id, id("a.bin"));
  EXPECT_EQ(at("../ds/a.bin", top.string() + "/out").id, id("a.bin"));  // physical: ".." is exact
  EXPECT_EQ(at("ds/b.bin", top.string()).id, id("b.bin"));
  EXPECT_EQ(at("a.bin", top.string() + "/out").where, Where::kOutside);
  EXPECT_EQ(at("a.bin", "").where, Where::kOutside);  // no current directory known
}

// A container's view: the dataset bound at another path, the job directory
// bound elsewhere, and the host paths the environment names hidden (by
// tmpfs mounts over them). The library finds both by what they are.
TEST_F(Handlers, ADatasetAndJobDirectoryMountedElsewhereAreFoundByIdentity) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace";
  ASSERT_EQ(unshare(CLONE_NEWNS), 0) << std::strerror(errno);
  ASSERT_EQ(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0);
  cache("a.bin", "dataset a");
  fs::path data = top / "data", elsewhere = top / "elsewhere";
  fs::create_directories(data);
  fs::create_directories(elsewhere);
  ASSERT_EQ(mount(ds.c_str(), data.c_str(), nullptr, MS_BIND, nullptr), 0);
  ASSERT_EQ(mount(job.c_str(), elsewhere.c_str(), nullptr, MS_BIND, nullptr), 0);
  ASSERT_EQ(mount("tmpfs", ds.c_str(), "tmpfs", 0, nullptr), 0);
  ASSERT_EQ(mount("tmpfs", (top / "tier").c_str(), "tmpfs", 0, nullptr), 0);
  // The process knows only the host paths, as a container's processes do.
  P.map = nullptr;
  P.next_load_ns = 0;
  ASSERT_TRUE(init_process(ds.c_str(), job.c_str(), false));
  EXPECT_EQ(std::string(P.job_dir), elsewhere.string());  // found by its name
  // No map yet: the first open of any absolute path looks for it.
  int fd = open_((data / "a.bin").string());
  ASSERT_GE(fd, 0);
  ASSERT_NE(P.map.load(), nullptr);
  const Located& l = located();
  ASSERT_EQ(l.views, 1);
  EXPECT_EQ(std::string(l.view[0]), data.string());
  EXPECT_TRUE(l.physical[0]);
  EXPECT_EQ(std::string(l.tier[0]), elsewhere.string());
  ASSERT_NE(tracked(fd), nullptr);
  EXPECT_EQ(tracked(fd)->kind.load(), kLocal);  // the copy, through the job directory seen here
  EXPECT_EQ(read_all(fd), "dataset a");
  real::close(fd);
  int pfs = open_((data / "b.bin").string());  // not cached: the PFS, through /data
  ASSERT_GE(pfs, 0);
  EXPECT_EQ(read_all(pfs), "dataset b!");
  real::close(pfs);
  EXPECT_EQ(resolve(*current_map(), l.as_views(), (data / "sub/../a.bin").string(), "").id,
            id("a.bin"));
  EXPECT_EQ(resolve(*current_map(), l.as_views(), "../a.bin", (data / "sub").string()).id,
            id("a.bin"));
  for (const fs::path& p : {top / "tier", ds, elsewhere, data}) umount2(p.c_str(), MNT_DETACH);
}

// A container that binds another directory over a part of the dataset's
// view (/data/sub): the kernel reads that directory's files there, so the
// view is not served at all; the bytes are the kernel's.
TEST_F(Handlers, AViewWithAnotherMountInsideIsNotServed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace";
  ASSERT_EQ(unshare(CLONE_NEWNS), 0) << std::strerror(errno);
  ASSERT_EQ(mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr), 0);
  cache("a.bin", "dataset a");
  cache("sub/c.bin", "dataset c");
  write(top / "other/c.bin", "OTHER c");
  fs::path data = top / "data";
  fs::create_directories(data);
  ASSERT_EQ(mount(ds.c_str(), data.c_str(), nullptr, MS_BIND, nullptr), 0);
  ASSERT_EQ(mount((top / "other").c_str(), (data / "sub").c_str(), nullptr, MS_BIND, nullptr), 0);
  P.map = nullptr;
  P.next_load_ns = 0;
  ASSERT_TRUE(init_process(ds.c_str(), job.c_str(), false));
  ASSERT_NE(current_map(), nullptr);
  const Located& l = located();
  for (int i = 0; i < l.views; ++i) EXPECT_NE(std::string(l.view[i]), data.string());
  int fd = open_((data / "sub/c.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(tracked(fd), nullptr);
  EXPECT_EQ(read_all(fd), "OTHER c");
  real::close(fd);
  int a = open_((ds / "a.bin").string());  // the host path is still whole: served
  ASSERT_GE(a, 0);
  ASSERT_NE(tracked(a), nullptr);
  EXPECT_EQ(tracked(a)->kind.load(), kLocal);
  real::close(a);
  for (const fs::path& p : {data / "sub", data}) umount2(p.c_str(), MNT_DETACH);
}

TEST_F(Handlers, CachedOpenIsTheCopyAndLooksLikeThePfsFile) {
  cache("a.bin", "dataset a");
  int fd = open_((ds / "a.bin").string());
  ASSERT_GE(fd, 0);
  FdEntry* e = tracked(fd);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->kind.load(), kLocal);
  EXPECT_EQ(read_all(fd), "dataset a");
  struct stat got, want;
  auto fstat_ = [&] { return real::fstat(fd, &got); };
  ASSERT_EQ(on_fstat(fd, &got, Pass<int>(fstat_)), 0);
  ASSERT_EQ(stat((ds / "a.bin").c_str(), &want), 0);
  EXPECT_EQ(got.st_ino, want.st_ino);  // the PFS file's, not the copy's
  char link[64], buf[512];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  auto rl = [&]() -> ssize_t { return real::readlink(link, buf, sizeof buf); };
  ssize_t n = on_readlink(AT_FDCWD, link, buf, sizeof buf, Pass<ssize_t>(rl));
  EXPECT_EQ(std::string(buf, n > 0 ? size_t(n) : 0), fs::canonical(ds / "a.bin").string());
  auto close_ = [&] { return real::close(fd); };
  on_close(fd, Pass<int>(close_));
  EXPECT_EQ(tracked(fd), nullptr);
}

TEST_F(Handlers, ADescriptorReusedBehindMonarchsBackIsNeverServed) {
  cache("a.bin", "dataset a");
  int fd = open_((ds / "a.bin").string());
  ASSERT_GE(fd, 0);
  ASSERT_NE(tracked(fd), nullptr);
  syscall(SYS_close, fd);  // a raw close: no wrapper saw it
  int other = real::open((top / "out/a.bin").c_str(), O_RDONLY);
  ASSERT_EQ(other, fd);
  struct stat got, want;
  auto fstat_ = [&] { return real::fstat(other, &got); };
  ASSERT_EQ(on_fstat(other, &got, Pass<int>(fstat_)), 0);
  ASSERT_EQ(stat((top / "out/a.bin").c_str(), &want), 0);
  EXPECT_EQ(got.st_ino, want.st_ino);
  EXPECT_EQ(tracked(other), nullptr);  // the false claim is forgotten
  real::close(other);
}

TEST_F(Handlers, UncachedOpenKeepsThePfsDescriptor) {
  int fd = open_((ds / "b.bin").string());
  ASSERT_GE(fd, 0);
  ASSERT_NE(tracked(fd), nullptr);
  EXPECT_EQ(tracked(fd)->kind.load(), kPfs);
  struct stat got, want;
  ASSERT_EQ(real::fstat(fd, &got), 0);
  ASSERT_EQ(stat((ds / "b.bin").c_str(), &want), 0);
  EXPECT_EQ(got.st_ino, want.st_ino);
  EXPECT_EQ(read_all(fd), "dataset b!");
  real::close(fd);
}

TEST_F(Handlers, WritesMakeTheFileStaleWhateverThePath) {
  cache("sub/c.bin", "dataset c");
  // Through a link from outside the dataset: the identity is what counts.
  int fd = open_((top / "alias/c.bin").string(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(m->state(id("sub/c.bin")).state, kStale);
  ASSERT_EQ(::write(fd, "+more", 5), 5);
  real::close(fd);
  struct stat st;
  auto stat_ = [&] { return real::stat((ds / "sub/c.bin").c_str(), &st); };
  ASSERT_EQ(on_stat(AT_FDCWD, (ds / "sub/c.bin").c_str(), &st, 0, Pass<int>(stat_)), 0);
  EXPECT_EQ(st.st_size, 14);  // the PFS answers from now on
  int r = open_((ds / "sub/c.bin").string());
  EXPECT_EQ(read_all(r), "dataset c+more");
  real::close(r);
}

TEST_F(Handlers, ErrnoIsTheKernelsOnEveryPath) {
  struct stat st;
  std::string missing = (ds / "sub/missing").string();
  auto stat_ = [&] { return real::stat(missing.c_str(), &st); };
  errno = 0;
  EXPECT_EQ(on_stat(AT_FDCWD, missing.c_str(), &st, 0, Pass<int>(stat_)), -1);
  EXPECT_EQ(errno, ENOENT);
  // A file marked stale passes through, with the kernel's errno too.
  mark_stale(m, id("a.bin"));
  fs::remove(ds / "a.bin");
  std::string a = (ds / "a.bin").string();
  auto stat_a = [&] { return real::stat(a.c_str(), &st); };
  errno = 0;
  EXPECT_EQ(on_stat(AT_FDCWD, a.c_str(), &st, 0, Pass<int>(stat_a)), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(Handlers, ADamagedMapIsNeverTrusted) {
  // A process of the job scribbles on the map: states and buckets out of range.
  m->entry(id("a.bin")).state = 0xfffffff4;  // "cached" on tier 15
  EXPECT_EQ(m->state(id("a.bin")).state, kFailed);
  int fd = open_((ds / "a.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read_all(fd), "dataset a");
  real::close(fd);
  mapped.map().header().file_size = 1ull << 40;
  EXPECT_FALSE(JobMap(&mapped.map().header(), mapped.bytes()).valid());
}

}  // namespace
}  // namespace monarch
