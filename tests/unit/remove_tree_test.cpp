#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "remove_tree.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;

TEST(RemoveTree, RemovesEverythingBelowWithoutFollowingLinks) {
  char name[] = "/tmp/monarch-rm-XXXXXX";
  fs::path base = mkdtemp(name);
  fs::path victim = base / "victim", job = base / "job";
  fs::create_directories(victim / "sub");
  std::ofstream(victim / "keep") << "precious";
  std::ofstream(victim / "sub" / "keep") << "precious";
  fs::create_directories(job / "data" / "a" / "b");
  std::ofstream(job / "data" / "a" / "b" / "f") << "copy";
  fs::create_directory_symlink(victim, job / "data" / "dirlink");
  fs::create_symlink(victim / "keep", job / "data" / "filelink");
  fs::create_directory_symlink(victim, job / "data" / "a" / "deeper");

  RemoveResult r = remove_tree(job.string());
  EXPECT_EQ(r.errors, 0u) << r.first_path;
  EXPECT_FALSE(fs::exists(fs::symlink_status(job)));
  EXPECT_TRUE(fs::exists(victim / "keep"));
  EXPECT_TRUE(fs::exists(victim / "sub" / "keep"));

  // The job directory itself replaced by a link: only the link goes.
  fs::create_directory_symlink(victim, job);
  r = remove_tree(job.string());
  EXPECT_FALSE(fs::exists(fs::symlink_status(job)));
  EXPECT_TRUE(fs::exists(victim / "sub" / "keep"));

  // Missing: nothing to do, no error.
  r = remove_tree((base / "absent").string());
  EXPECT_EQ(r.errors, 0u);
  fs::remove_all(base);
}

}  // namespace
}  // namespace monarch
