// The trash: a directory moves aside in one rename whatever it holds, and
// the purge deletes everything, one purge at a time.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fd.h"
#include "trash.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;

struct TrashFixture : ::testing::Test {
  void SetUp() override {
    char name[] = "/tmp/monarch-trash-XXXXXX";
    base = mkdtemp(name);
    fs::create_directory(base / "trash");
    fs::permissions(base / "trash", fs::perms::owner_all);
    parent = Fd(open(base.c_str(), O_RDONLY | O_DIRECTORY));
    trash = Fd(open((base / "trash").c_str(), O_RDONLY | O_DIRECTORY));
  }
  void TearDown() override { fs::remove_all(base); }
  fs::path base;
  Fd parent, trash;
};

TEST_F(TrashFixture, MovesAsideThenPurges) {
  for (const char* job : {"monarch-job1", "monarch-job2"}) {
    fs::create_directories(base / job / "data" / "a");
    std::ofstream(base / job / "data" / "a" / "f") << "copy";
  }
  fs::create_directory_symlink(base / "monarch-job1", base / "link");
  ASSERT_TRUE(move_to_trash(parent.get(), "monarch-job1", trash.get()));
  ASSERT_TRUE(move_to_trash(parent.get(), "monarch-job2", trash.get()));
  ASSERT_TRUE(move_to_trash(parent.get(), "link", trash.get()));  // the link itself
  EXPECT_FALSE(move_to_trash(parent.get(), "absent", trash.get()));
  EXPECT_EQ(errno, ENOENT);
  EXPECT_FALSE(fs::exists(base / "monarch-job1"));
  EXPECT_TRUE(trash_has_entries(trash.get()));

  PurgeResult r = purge_trash(trash.get());
  EXPECT_FALSE(r.busy);
  EXPECT_EQ(r.entries, 3u);
  EXPECT_EQ(r.removed.errors, 0u);
  EXPECT_FALSE(trash_has_entries(trash.get()));
}

TEST_F(TrashFixture, OnePurgeAtATime) {
  fs::create_directories(base / "monarch-job3" / "x");
  ASSERT_TRUE(move_to_trash(parent.get(), "monarch-job3", trash.get()));
  Fd other(open((base / "trash").c_str(), O_RDONLY | O_DIRECTORY));
  ASSERT_EQ(flock(other.get(), LOCK_EX | LOCK_NB), 0);  // another purge runs
  PurgeResult r = purge_trash(trash.get());
  EXPECT_TRUE(r.busy);
  EXPECT_TRUE(trash_has_entries(trash.get()));
  other.reset();
  r = purge_trash(trash.get());
  EXPECT_FALSE(r.busy);
  EXPECT_FALSE(trash_has_entries(trash.get()));
}

// A file at the trash's top that someone still holds open (a job's image,
// kept by its loop device) gives its blocks back; one with another name
// keeps its bytes there.
TEST_F(TrashFixture, HeldFileGivesItsBlocksBack) {
  constexpr off_t kSize = 8 << 20;
  Fd held(open((base / "job4.img").c_str(), O_RDWR | O_CREAT | O_EXCL, 0600));
  ASSERT_TRUE(held);
  ASSERT_EQ(posix_fallocate(held.get(), 0, kSize), 0);
  std::ofstream(base / "linked") << "kept";
  ASSERT_EQ(link((base / "linked").c_str(), (base / "other-name").c_str()), 0);
  ASSERT_TRUE(move_to_trash(parent.get(), "job4.img", trash.get()));
  ASSERT_TRUE(move_to_trash(parent.get(), "linked", trash.get()));
  struct stat st;
  ASSERT_EQ(fstat(held.get(), &st), 0);
  EXPECT_GE(st.st_blocks * 512, kSize);

  PurgeResult r = purge_trash(trash.get());
  EXPECT_EQ(r.entries, 2u);
  EXPECT_FALSE(trash_has_entries(trash.get()));
  ASSERT_EQ(fstat(held.get(), &st), 0);
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_EQ(st.st_blocks, 0);
  std::ifstream in(base / "other-name");
  std::string text;
  in >> text;
  EXPECT_EQ(text, "kept");
}

}  // namespace
}  // namespace monarch
