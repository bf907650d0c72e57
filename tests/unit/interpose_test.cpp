// The interposition library's handlers, called in-process with a job map built
// in the test: no LD_PRELOAD, no stager. `pass` is the real call.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "client.h"
#include "fdtable.h"
#include "handlers.h"
#include "index.h"
#include "mappings.h"
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

  // A mount namespace of this test's own, its mounts private; false without root.
  static bool private_mounts() {
    return geteuid() == 0 && unshare(CLONE_NEWNS) == 0 &&
           mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
  }
  // As a process before it found its map, where the path given shows no
  // dataset (a container's): the next absolute open looks for the map.
  static void forget_map() {
    P.map = nullptr;
    P.seeking = true;
    P.early_done = true;
    P.next_seek_ns = 0;
    P.next_load_ns = 0;
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
  if (!private_mounts()) GTEST_SKIP() << "needs root for a mount namespace";
  cache("a.bin", "dataset a");
  char name[] = "/tmp/monarch-container-XXXXXX";
  fs::path outer = mkdtemp(name), data = outer / "data", elsewhere = outer / "elsewhere";
  fs::create_directories(data);
  fs::create_directories(elsewhere);
  ASSERT_EQ(mount(ds.c_str(), data.c_str(), nullptr, MS_BIND, nullptr), 0);
  ASSERT_EQ(mount(job.c_str(), elsewhere.c_str(), nullptr, MS_BIND, nullptr), 0);
  ASSERT_EQ(mount("tmpfs", top.c_str(), "tmpfs", 0, nullptr), 0);  // the host paths: absent
  ASSERT_FALSE(fs::exists(ds));
  // The process knows only the host paths, as a container's processes do.
  forget_map();
  ASSERT_TRUE(init_process(ds.c_str(), job.c_str(), false));
  EXPECT_TRUE(P.seeking.load());
  EXPECT_EQ(std::string(P.job_dir), elsewhere.string());  // found by a mount of it
  // A job directory found by its name is adopted with a running stager only.
  m->header().heartbeat_ns = monotonic_ns();
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
  for (const fs::path& p : {top, elsewhere, data}) umount2(p.c_str(), MNT_DETACH);
  fs::remove_all(outer);
}

// Apptainer binds $HOME and /tmp by default: the path given is visible, and
// the program reads the dataset through another bind (/data). The first
// absolute open finds /data, so that an open there finds the map.
TEST_F(Handlers, BeforeAMapTheMountsOfThePathGivenAreFound) {
  if (!private_mounts()) GTEST_SKIP() << "needs root for a mount namespace";
  cache("a.bin", "dataset a");
  fs::path data = top / "data";
  fs::create_directories(data);
  ASSERT_EQ(mount(ds.c_str(), data.c_str(), nullptr, MS_BIND, nullptr), 0);
  forget_map();
  P.early_done = false;
  ASSERT_TRUE(init_process(ds.c_str(), job.c_str(), false));
  EXPECT_TRUE(outside(AT_FDCWD, "/etc/hostname"));  // the first absolute open: the mounts
  EXPECT_EQ(P.map.load(), nullptr);                 // no map loaded for it
  EXPECT_FALSE(P.seeking.load());
  ASSERT_EQ(located().views, 2);
  int fd = open_((data / "a.bin").string());
  ASSERT_GE(fd, 0);
  ASSERT_NE(P.map.load(), nullptr);
  ASSERT_NE(tracked(fd), nullptr);
  EXPECT_EQ(tracked(fd)->kind.load(), kLocal);
  EXPECT_EQ(read_all(fd), "dataset a");
  real::close(fd);
  umount2(data.c_str(), MNT_DETACH);
}

// A container that binds another directory over a part of the dataset's
// view (/data/sub): the kernel reads that directory's files there, so the
// view is not served at all; the bytes are the kernel's.
TEST_F(Handlers, AViewWithAnotherMountInsideIsNotServed) {
  if (!private_mounts()) GTEST_SKIP() << "needs root for a mount namespace";
  cache("a.bin", "dataset a");
  cache("sub/c.bin", "dataset c");
  write(top / "other/c.bin", "OTHER c");
  fs::path data = top / "data";
  fs::create_directories(data);
  ASSERT_EQ(mount(ds.c_str(), data.c_str(), nullptr, MS_BIND, nullptr), 0);
  ASSERT_EQ(mount((top / "other").c_str(), (data / "sub").c_str(), nullptr, MS_BIND, nullptr), 0);
  forget_map();
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

// An open for writing that does not change the file by itself
// (sqlite3.connect, lmdb.open) is the program's own PFS descriptor and leaves
// the file as it is, until a call that may change it through that open file.
TEST_F(Handlers, AnOpenForReadingAndWritingIsAChangeOnlyOnceItWrites) {
  cache("a.bin", "dataset a");
  cache("b.bin", "dataset b!");
  cache("sub/c.bin", "dataset c");
  int fd = open_((ds / "a.bin").string(), O_RDWR | O_CREAT);
  ASSERT_GE(fd, 0);
  ASSERT_NE(tracked(fd), nullptr);
  EXPECT_EQ(tracked(fd)->kind.load(), kPfs);
  EXPECT_TRUE(tracked(fd)->writable);
  EXPECT_EQ(real::fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);  // the PFS file's own descriptor
  EXPECT_EQ(read_all(fd), "dataset a");
  EXPECT_EQ(m->state(id("a.bin")).state, kCached);
  auto fn = [&]() -> FILE* { return nullptr; };  // fdopen's own work does not matter here
  on_fdopen(fd, "r", Pass<FILE*>(fn));           // a stream that cannot write
  EXPECT_EQ(m->state(id("a.bin")).state, kCached);
  changes(fd);  // what the write wrappers call first
  EXPECT_EQ(m->state(id("a.bin")).state, kStale);
  real::close(fd);
  // Write-only or appending (a shell's `>>`, whose echo writes through
  // stdio): a change at open.
  fd = open_((ds / "b.bin").string(), O_WRONLY | O_APPEND);
  EXPECT_EQ(m->state(id("b.bin")).state, kStale);
  real::close(fd);
  cache("b.bin", "dataset b!");
  fd = open_((ds / "b.bin").string(), O_RDWR | O_APPEND);
  EXPECT_EQ(m->state(id("b.bin")).state, kStale);
  real::close(fd);
  // O_TRUNC changes the file at once; a descriptor for reading never does.
  int ro = open_((ds / "sub/c.bin").string());
  changes(ro);
  on_fdopen(ro, "r+", Pass<FILE*>(fn));
  EXPECT_EQ(m->state(id("sub/c.bin")).state, kCached);
  fd = open_((ds / "sub/c.bin").string(), O_RDWR | O_TRUNC);
  EXPECT_EQ(m->state(id("sub/c.bin")).state, kStale);
  real::close(fd);
  real::close(ro);
}

TEST_F(Handlers, AReadWriteDescriptorThatStdioOrAnUnseenCallCanWriteIsAChange) {
  cache("a.bin", "dataset a");
  cache("b.bin", "dataset b!");
  // Onto descriptor 0, 1 or 2: stdio's stdin, stdout and stderr write it
  // with glibc's own calls.
  int fd = open_((ds / "a.bin").string(), O_RDWR);
  ASSERT_NE(tracked(fd), nullptr);
  int saved = real::dup(2);
  auto dup2_ = [&] { return real::dup2(fd, 2); };
  EXPECT_EQ(on_dup2(fd, 2, Pass<int>(dup2_)), 2);
  EXPECT_EQ(m->state(id("a.bin")).state, kStale);
  real::dup2(saved, 2);
  untrack(2);
  real::close(saved);
  real::close(fd);
  // Written by a call Monarch does not see (dprintf's internal write): a
  // change when the descriptor closes, its version no longer the index's.
  fd = open_((ds / "b.bin").string(), O_RDWR);
  ASSERT_NE(tracked(fd), nullptr);
  ASSERT_EQ(syscall(SYS_pwrite64, fd, "X", 1, 0), 1);
  EXPECT_EQ(m->state(id("b.bin")).state, kCached);
  auto close_ = [&] { return real::close(fd); };
  EXPECT_EQ(on_close(fd, Pass<int>(close_)), 0);
  EXPECT_EQ(m->state(id("b.bin")).state, kStale);
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

// ---- Review 4 (issue 24: views and job directories found by identity) ----

// A process whose map is loaded by an open (seek_map) while it holds a
// descriptor it opened for writing before: the owner marks that file stale
// when it adopts the map (writers_already_open), so a write the library never
// sees (through a shared mapping, here a raw pwrite) is read back from the PFS.
// The control for the next test.
TEST_F(Handlers, AMapSeekByTheOwnerMarksEarlierWritersStale) {
  cache("a.bin", "dataset a");
  int w = real::open((ds / "a.bin").c_str(), O_RDWR);
  ASSERT_GE(w, 0);
  forget_map();
  outside(AT_FDCWD, "/etc/hostname");  // any absolute open looks for the map
  ASSERT_NE(P.map.load(), nullptr);
  ASSERT_EQ(pwrite(w, "CHANGED!!", 9, 0), 9);  // unseen by the library (a MAP_SHARED store)
  int fd = open_((ds / "a.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read_all(fd), "CHANGED!!");
  real::close(fd);
  real::close(w);
}

// The same, but the open that finds the map is a vfork child's (a program's
// own vfork before exec): outside() calls seek_map() before any owner()
// check, so the child publishes the map into its parent's memory and skips
// what only the owner does (writers_already_open, find_ancestors,
// update_cwd_hint). The parent then serves the stale copy: wrong bytes.
// (process.h: "a vfork child ... must never change Monarch's state".)
TEST_F(Handlers, AVforkChildsOpenNeverAdoptsAMapForItsParent) {
  cache("a.bin", "dataset a");
  int w = real::open((ds / "a.bin").c_str(), O_RDWR);
  ASSERT_GE(w, 0);
  forget_map();
  P.ancestor_count = 0;
  pid_t pid = vfork();
  if (pid == 0) {
    outside(AT_FDCWD, "/etc/hostname");  // what the open wrapper does first
    _exit(0);
  }
  ASSERT_GT(pid, 0);
  int status;
  waitpid(pid, &status, 0);
  EXPECT_EQ(P.map.load(), nullptr) << "the vfork child adopted a map in its parent's memory";
  EXPECT_EQ(P.ancestor_count.load(), 0);
  ASSERT_EQ(pwrite(w, "CHANGED!!", 9, 0), 9);
  int fd = open_((ds / "a.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read_all(fd), "CHANGED!!") << "a file written before the map was served from its copy";
  real::close(fd);
  real::close(w);
}

// The dataset visible at two paths here (its own, and a bind at data/): a copy
// opened through data/ is named by readlink("/proc/self/fd/N") as the kernel
// names a PFS descriptor opened through data/, the path the program used.
TEST_F(Handlers, ReadlinkOfACopyNamesThePathItWasOpenedThrough) {
  if (!private_mounts()) GTEST_SKIP() << "needs root for a mount namespace";
  fs::path data = top / "data";
  fs::create_directories(data);
  ASSERT_EQ(mount(ds.c_str(), data.c_str(), nullptr, MS_BIND, nullptr), 0);
  cache("a.bin", "dataset a");
  forget_map();
  ASSERT_TRUE(init_process(ds.c_str(), job.c_str(), false));
  ASSERT_NE(current_map(), nullptr);
  ASSERT_EQ(located().views, 2);
  std::string path = (data / "a.bin").string();
  int fd = open_(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(tracked(fd)->kind.load(), kLocal);
  int pfs = real::open(path.c_str(), O_RDONLY);  // what the kernel says without Monarch
  char link[64], want[512], got[512];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", pfs);
  ssize_t wn = real::readlink(link, want, sizeof want);
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  auto rl = [&]() -> ssize_t { return real::readlink(link, got, sizeof got); };
  ssize_t gn = on_readlink(AT_FDCWD, link, got, sizeof got, Pass<ssize_t>(rl));
  EXPECT_EQ(std::string(got, gn > 0 ? size_t(gn) : 0), std::string(want, wn > 0 ? size_t(wn) : 0));
  real::close(pfs);
  real::close(fd);
  umount2(data.c_str(), MNT_DETACH);
}

// A directory mounted over a dataset directory below a view (a container's
// "-v /pfs/ds:/data -v /elsewhere:/data/sub"): what the kernel opens at
// data/sub/c.bin is that directory's file, never the dataset's copy.
TEST_F(Handlers, AMountBelowAViewIsNeverServedFromTheDatasetsCopies) {
  if (!private_mounts()) GTEST_SKIP() << "needs root for a mount namespace";
  cache("sub/c.bin", "dataset c");
  fs::path data = top / "data", other = top / "other";
  write(other / "c.bin", "OTHER c!!");
  fs::create_directories(data);
  ASSERT_EQ(mount(ds.c_str(), data.c_str(), nullptr, MS_BIND, nullptr), 0);
  ASSERT_EQ(mount(other.c_str(), (data / "sub").c_str(), nullptr, MS_BIND, nullptr), 0);
  forget_map();
  ASSERT_TRUE(init_process((data).c_str(), job.c_str(), false));
  ASSERT_NE(current_map(), nullptr);
  int fd = open_((data / "sub/c.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read_all(fd), "OTHER c!!");
  real::close(fd);
  umount2((data / "sub").c_str(), MNT_DETACH);
  umount2(data.c_str(), MNT_DETACH);
}

// The job directory is found by its name alone (MONARCH_JOB_DIR carries no
// identity): where the path given is hidden, find_job_dir takes the first
// mount that shows a directory of that name, here another job's, left on a
// scratch file system the container mounts (monarch-run's "run-<pid>" names
// repeat in a PID namespace; --keep leaves a job's directory). Its map is
// this user's and of this dataset, so it is adopted, and its copies (of the
// dataset as it was then) are served although the file changed since: wrong
// bytes. Its stager is long gone (the map's heartbeat says so).
TEST_F(Handlers, AnotherJobsDirectoryOfTheSameNameIsNeverAdopted) {
  if (!private_mounts()) GTEST_SKIP() << "needs root for a mount namespace";
  fs::path scratch = top / "scratch";
  fs::create_directories(scratch);
  ASSERT_EQ(mount("tmpfs", scratch.c_str(), "tmpfs", 0, nullptr), 0);
  fs::path old = scratch / job.filename();  // the other job's directory, same name
  fs::create_directories(old / "data");
  IndexOptions o{.root = ds.string(),
                 .out_path = (old / "index").string(),
                 .tier_dirs = {old.string()},
                 .small_file_max = 1 << 20,
                 .stall_ns = 200'000'000,
                 .generation = 3};
  IndexStats stats;
  MappedMap old_map = build_index(o, stats, [](JobMap&) {});
  write(old / "data/a.bin", "dataset a");  // that job's copy, complete and published
  old_map.map().entry(uint32_t(old_map.map().find("a.bin"))).state = make_state(kCached, 0);
  write(ds / "a.bin", "NEW a!!!!");  // the dataset changed since (same size)
  ASSERT_EQ(mount("tmpfs", (top / "tier").c_str(), "tmpfs", 0, nullptr), 0);  // this job's: hidden
  forget_map();
  ASSERT_TRUE(init_process(ds.c_str(), job.c_str(), false));
  int fd = open_((ds / "a.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read_all(fd), "NEW a!!!!") << "served from " << P.job_dir;
  real::close(fd);
  for (const fs::path& p : {top / "tier", scratch}) umount2(p.c_str(), MNT_DETACH);
}

// MONARCH_JOB_DIRS naming a directory made to look like a tier's job
// directory (data/ with a file of the dataset's name): never used, its
// identity is not the tier's. (Holds today; kept as a guard.)
TEST_F(Handlers, AJobDirectoryLookAlikeInJobDirsIsNeverUsed) {
  fs::path fake = top / "fake/monarch-t";
  write(fake / "data/a.bin", "FAKE!!!!!");
  m->entry(uint32_t(m->find("a.bin"))).state = make_state(kCached, 0);
  forget_map();
  ASSERT_TRUE(init_process(ds.c_str(), fake.c_str(), false, fake.c_str()));
  EXPECT_EQ(current_map(), nullptr);  // tier 0's map is looked for there: none
  P.next_load_ns = 0;
  ASSERT_TRUE(
      init_process(ds.c_str(), job.c_str(), false, (fake.string() + ":" + fake.string()).c_str()));
  ASSERT_NE(current_map(), nullptr);
  EXPECT_EQ(std::string(located().tier[0]), job.string());
  int fd = open_((ds / "a.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_NE(read_all(fd), "FAKE!!!!!");
  real::close(fd);
}

// The dataset given through a symbolic link (monarch-run --dataset ~/ds-link,
// a view that is not physical) while a bind shows other files over a
// directory of it: drop_shadowed compares mount points with each view's path
// string, and the mount point is the link's target (ds/sub), never below
// "dslink": the link's view is kept and serves the dataset's copy where the
// kernel reads the mount's file.
TEST_F(Handlers, AMountBelowAViewReachedThroughALinkIsNeverServed) {
  if (!private_mounts()) GTEST_SKIP() << "needs root for a mount namespace";
  cache("sub/c.bin", "dataset c");
  fs::path link = top / "dslink", other = top / "other";
  fs::create_directory_symlink(ds, link);
  write(other / "c.bin", "OTHER c!!");
  ASSERT_EQ(mount(other.c_str(), (ds / "sub").c_str(), nullptr, MS_BIND, nullptr), 0);
  forget_map();
  ASSERT_TRUE(init_process(link.c_str(), job.c_str(), false));
  ASSERT_NE(current_map(), nullptr);
  int fd = open_((link / "sub/c.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read_all(fd), "OTHER c!!");
  real::close(fd);
  umount2((ds / "sub").c_str(), MNT_DETACH);
}

// A signal handler's open of a path outside the dataset (a profiler reading
// /proc/self/stat) that interrupts this thread's own map load (an open of a
// dataset path, before any map): outside() now looks for the map, and
// load_map waits for the load in progress, which cannot move while its own
// thread runs the handler: at least 1000 sleeps of 50 us. Before issue 24
// such an open cost a prefix comparison. (P.loading = 1 stands for the
// interrupted load.)
TEST_F(Handlers, AnOpenOutsideTheDatasetNeverWaitsForAMapLoad) {
  forget_map();
  P.loading = 1;
  uint64_t t0 = monotonic_ns();
  EXPECT_TRUE(outside(AT_FDCWD, "/proc/self/stat"));
  uint64_t ms = (monotonic_ns() - t0) / 1'000'000;
  P.loading = 0;
  EXPECT_LT(ms, 40u) << "an open outside the dataset waited " << ms << " ms for a map load";
}

// A file system mounted inside the dataset where the stager indexed it (the
// index crosses mounts) and absent in this process's namespace (a container's
// non-recursive bind of the dataset): the kernel shows the directory under
// that mount, here with another file of the same name. drop_shadowed looks
// only at the mounts this process has, never at the ones the index went
// through, so the view is served: the submount's copy instead of the file
// the kernel reads. (tests/review4/submount.sh is the same with monarch-run.)
TEST_F(Handlers, AMountTheIndexCrossedThatIsAbsentHereIsNeverServed) {
  if (!private_mounts()) GTEST_SKIP() << "needs root for a mount namespace";
  write(ds / "inner/x.bin", "UNDER x!!");  // what the directory holds under the mount
  ASSERT_EQ(mount("tmpfs", (ds / "inner").c_str(), "tmpfs", 0, nullptr), 0);
  write(ds / "inner/x.bin", "SUBMOUNT!");
  IndexOptions o{.root = ds.string(),
                 .out_path = (job / "index").string(),
                 .tier_dirs = {job.string()},
                 .small_file_max = 1 << 20,
                 .stall_ns = 200'000'000,
                 .generation = 8};
  IndexStats stats;
  MappedMap with_mount = build_index(o, stats, [](JobMap&) {});
  ASSERT_GE(with_mount.map().find("inner/x.bin"), 0);
  write(job / "data/inner/x.bin", "SUBMOUNT!");
  with_mount.map().entry(uint32_t(with_mount.map().find("inner/x.bin"))).state =
      make_state(kCached, 0);
  ASSERT_EQ(umount2((ds / "inner").c_str(), MNT_DETACH), 0);  // this process's namespace
  forget_map();
  ASSERT_TRUE(init_process(ds.c_str(), job.c_str(), false));
  ASSERT_NE(current_map(), nullptr);
  int fd = open_((ds / "inner/x.bin").string());
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read_all(fd), "UNDER x!!");
  real::close(fd);
}

// ---- mappings (mappings.h) ----

// The path the kernel shows for the mapping at `p` ("" when none).
std::string mapped_path(const void* p) {
  std::ifstream f("/proc/self/maps");
  for (std::string line; std::getline(f, line);) {
    uintptr_t a = std::stoull(line.substr(0, line.find('-')), nullptr, 16);
    uintptr_t b = std::stoull(line.substr(line.find('-') + 1), nullptr, 16);
    if (uintptr_t(p) >= a && uintptr_t(p) < b) {
      size_t slash = line.find('/');
      return slash == std::string::npos ? "[anonymous]" : line.substr(slash);
    }
  }
  return "";
}

// A mapping through the handler. (The small file's open handed its bytes to
// no stager here and gave up on a copy: as if a stager had taken them.)
void* mmap_(void* at, size_t len, int prot, int flags, int fd) {
  tracked(fd)->gave_up = false;
  auto fn = [&] { return real::mmap(at, len, prot, flags, fd, 0); };
  return on_mmap(at, len, prot, flags, fd, 0, Pass<void*>(fn));
}
int munmap_(void* at, size_t len) {
  auto fn = [&] { return real::munmap(at, len); };
  return on_munmap(at, len, Pass<int>(fn));
}
// The stager published a copy: processes with mappings look at their next call.
void published(JobMap* m) {
  m->header().copies_changed.fetch_add(1);
  maps_check();
}

// The kernel's view by PROCMAP_QUERY, then by /proc/self/maps's lines (older kernels).
TEST_F(Handlers, AMappingMadeBeforeItsCopyMovesToItAndBackWhenTheFileChanges) {
  for (bool by_lines : {false, true}) {
    SCOPED_TRACE(by_lines ? "/proc/self/maps" : "PROCMAP_QUERY");
    g_maps_by_lines = by_lines;
    m->entry(id("b.bin")).state = make_state(kNone);
    int fd = open_((ds / "b.bin").string());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(tracked(fd)->kind.load(), kPfs);
    auto* p = static_cast<const char*>(mmap_(nullptr, 10, PROT_READ, MAP_SHARED, fd));
    ASSERT_NE(p, MAP_FAILED);
    real::close(fd);
    EXPECT_EQ(mapped_path(p), fs::canonical(ds / "b.bin").string());
    cache("b.bin", "dataset b!");
    published(m);
    EXPECT_EQ(mapped_path(p), (job / "data/b.bin").string());  // moved, same address
    EXPECT_EQ(std::string(p, 10), "dataset b!");
    mark_stale(m, id("b.bin"));  // the job writes it: the PFS file first
    EXPECT_EQ(mapped_path(p), fs::canonical(ds / "b.bin").string());
    EXPECT_EQ(std::string(p, 10), "dataset b!");
    EXPECT_EQ(munmap_(const_cast<char*>(p), 10), 0);
    EXPECT_EQ(mapped_path(p), "");
  }
  g_maps_by_lines = false;
}

TEST_F(Handlers, AMovedMappingMadeWritableIsThePfsFilesAgain) {
  int fd = open_((ds / "b.bin").string());
  auto* p = static_cast<char*>(mmap_(nullptr, 10, PROT_READ, MAP_PRIVATE, fd));
  ASSERT_NE(p, MAP_FAILED);
  real::close(fd);
  cache("b.bin", "dataset b!");
  published(m);
  ASSERT_EQ(mapped_path(p), (job / "data/b.bin").string());
  auto fn = [&] { return real::mprotect(p, 10, PROT_READ | PROT_WRITE); };
  ASSERT_EQ(on_mprotect(p, 10, PROT_READ | PROT_WRITE, Pass<int>(fn)), 0);
  EXPECT_EQ(mapped_path(p), fs::canonical(ds / "b.bin").string());
  p[0] = 'D';  // the process's own page now
  EXPECT_EQ(std::string(p, 10), "Dataset b!");
  published(m);  // never moved again: it may hold the program's writes
  EXPECT_EQ(mapped_path(p), fs::canonical(ds / "b.bin").string());
  EXPECT_EQ(munmap_(p, 10), 0);
}

TEST_F(Handlers, AMappingRemovedBehindMonarchsBackIsNeverReplaced) {
  int fd = open_((ds / "b.bin").string());
  auto* p = static_cast<char*>(mmap_(nullptr, 10, PROT_READ, MAP_SHARED, fd));
  ASSERT_NE(p, MAP_FAILED);
  real::close(fd);
  // A raw munmap, and the program's own memory at that address since.
  ASSERT_EQ(syscall(SYS_munmap, p, 10), 0);
  void* mine =
      real::mmap(p, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  ASSERT_EQ(mine, p);
  std::memcpy(p, "the program's", 13);
  cache("b.bin", "dataset b!");
  published(m);
  EXPECT_EQ(std::string(p, 13), "the program's");
  EXPECT_EQ(mapped_path(p), "[anonymous]");
  EXPECT_EQ(munmap_(p, 4096), 0);
}

}  // namespace
}  // namespace monarch
