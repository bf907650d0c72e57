// Where a directory may be visible in a mount namespace: mountinfo's lines
// as the kernel writes them, and the candidates they give.
#include "views.h"

#include <gtest/gtest.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

namespace monarch {
namespace {

Mount parse(std::string& line) {
  Mount m;
  EXPECT_TRUE(parse_mount(line.data(), m)) << line;
  return m;
}

std::vector<std::string> candidates(const Mount& m, uint64_t dev, std::string_view host) {
  std::vector<std::string> out;
  if (on_device(m, dev))
    mount_candidates(m, host, [&](std::string_view c) { out.emplace_back(c); });
  return out;
}

TEST(Views, MountinfoLinesAreParsedAsTheKernelWritesThem) {
  std::string line =
      "36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue";
  Mount m = parse(line);
  EXPECT_EQ(m.major, 98u);
  EXPECT_EQ(m.minor, 0u);
  EXPECT_EQ(m.root, "/mnt1");
  EXPECT_EQ(m.point, "/mnt2");
  EXPECT_EQ(m.type, "ext3");
  std::string spaced = "40 1 0:52 /my\\040data /data\\040set rw - lustre fs rw";  // octal escapes
  Mount s = parse(spaced);
  EXPECT_EQ(s.root, "/my data");
  EXPECT_EQ(s.point, "/data set");
  EXPECT_EQ(s.type, "lustre");
  for (std::string bad : {"", "36 35 98:0 /a /b rw", "36 35 98 /a /b rw - ext4 x rw",
                          "36 35 x:0 /a /b rw - ext4 x rw"}) {
    Mount b;
    EXPECT_FALSE(parse_mount(bad.data(), b)) << bad;
  }
}

TEST(Views, ABindMountOfTheDatasetIsACandidate) {
  uint64_t dev = makedev(0, 52);
  std::string big = "40 1 259:65536 / / rw - ext4 /dev/nvme0n1p1 rw";  // a large minor
  Mount nvme = parse(big);  // (parse_mount cuts the line in place: once)
  EXPECT_TRUE(on_device(nvme, makedev(259, 65536)));
  EXPECT_FALSE(on_device(nvme, makedev(259, 0)));
  // pyxis --container-mounts=/scratch/me/ds:/data, /scratch the file system's root.
  std::string bind = "40 1 0:52 /me/ds /data rw - lustre fs rw";
  EXPECT_EQ(candidates(parse(bind), dev, "/scratch/me/ds"), std::vector<std::string>{"/data"});
  // The whole file system mounted at /mnt/pfs: the dataset below it.
  std::string whole = "41 1 0:52 / /mnt/pfs rw - lustre fs rw";
  EXPECT_EQ(candidates(parse(whole), dev, "/scratch/me/ds"),
            (std::vector<std::string>{"/mnt/pfs/scratch/me/ds", "/mnt/pfs/me/ds", "/mnt/pfs/ds"}));
  // A parent of the dataset bound: the dataset below the mount point.
  std::string parent = "42 1 0:52 /me /home/me/pfs rw - lustre fs rw";
  EXPECT_EQ(candidates(parse(parent), dev, "/scratch/me/ds"),
            std::vector<std::string>{"/home/me/pfs/ds"});
  // The dataset mounted at the container's root.
  std::string at_root = "43 1 0:52 /me/ds / rw - lustre fs rw";
  EXPECT_EQ(candidates(parse(at_root), dev, "/scratch/me/ds"), std::vector<std::string>{"/"});
}

TEST(Views, OtherFileSystemsAndOtherDirectoriesAreNot) {
  uint64_t dev = makedev(0, 52);
  std::string other_dev = "40 1 0:53 /me/ds /data rw - lustre fs rw";
  EXPECT_TRUE(candidates(parse(other_dev), dev, "/scratch/me/ds").empty());
  // A sibling whose name starts alike, and a part of the dataset (served by nothing).
  std::string sibling = "40 1 0:52 /me/ds2 /data rw - lustre fs rw";
  EXPECT_TRUE(candidates(parse(sibling), dev, "/scratch/me/ds").empty());
  std::string part = "40 1 0:52 /me/ds/train /data rw - lustre fs rw";
  EXPECT_TRUE(candidates(parse(part), dev, "/scratch/me/ds").empty());
  // Too long to be a path: no candidate, no overflow.
  std::string deep = "40 1 0:52 / /" + std::string(kPathMax, 'x') + " rw - lustre fs rw";
  EXPECT_TRUE(candidates(parse(deep), dev, "/scratch/me/ds").empty());
}

std::string root_of(std::string_view cwd, std::string_view path, std::string_view rel,
                    size_t cap = kPathMax) {
  char out[kPathMax];
  size_t n = root_along(cwd, path, rel, out, std::min(cap, sizeof out));
  return n ? std::string(out, n) : "(none)";
}

TEST(Views, TheRootAlongAPathIsWhatPrecedesTheFilesIndexPath) {
  // A symbolic link outside the dataset (~/data -> /scratch/me/ds) and a bind mount.
  EXPECT_EQ(root_of("", "/home/me/data/x", "x"), "/home/me/data");
  EXPECT_EQ(root_of("", "/home/me/data/a/b/x", "a/b/x"), "/home/me/data");
  EXPECT_EQ(root_of("", "/mnt/ds/train/0001.jpg", "train/0001.jpg"), "/mnt/ds");
  // Spelled loosely: empty components and "." are the kernel's no-ops.
  EXPECT_EQ(root_of("", "//home/./me//data/a/./b//x", "a/b/x"), "/home/me/data");
  // Relative to the current directory, inside the link or above it.
  EXPECT_EQ(root_of("/home/me/data/a", "b/x", "a/b/x"), "/home/me/data");
  EXPECT_EQ(root_of("/home/me/data/a/b", "x", "a/b/x"), "/home/me/data");
  EXPECT_EQ(root_of("/home/me", "./data/a/b/x", "a/b/x"), "/home/me/data");
  EXPECT_EQ(root_of("/home/me/", "data//x", "x"), "/home/me/data");
  // An absolute path ignores the current directory.
  EXPECT_EQ(root_of("/elsewhere", "/home/me/data/x", "x"), "/home/me/data");
}

TEST(Views, NoRootWhereThePathIsNotTheFilesOrCannotBeKnownLexically) {
  // Another name: the tail differs (a hard link elsewhere, a renamed copy).
  EXPECT_EQ(root_of("", "/home/me/data/y", "x"), "(none)");
  EXPECT_EQ(root_of("", "/home/me/data/c/x", "a/b/x"), "(none)");
  EXPECT_EQ(root_of("", "/home/me/data/ab/x", "a/b/x"), "(none)");
  EXPECT_EQ(root_of("", "/home/me/xa/b/x", "a/b/x"), "(none)");  // components, not characters
  // ".." after a possible link is not the lexical parent, before or after the root.
  EXPECT_EQ(root_of("", "/home/link/../data/x", "x"), "(none)");
  EXPECT_EQ(root_of("", "/home/data/a/../a/x", "a/x"), "(none)");
  EXPECT_EQ(root_of("/home/../me", "data/x", "x"), "(none)");
  // The root would be "/", which is no dataset's view; or nothing at all.
  EXPECT_EQ(root_of("", "/a/x", "a/x"), "(none)");
  EXPECT_EQ(root_of("", "/x", "x"), "(none)");
  EXPECT_EQ(root_of("", "x", "x"), "(none)");  // relative with no current directory
  EXPECT_EQ(root_of("relative", "x", "x"), "(none)");
  EXPECT_EQ(root_of("", "/home/me/data/x", ""), "(none)");
  EXPECT_EQ(root_of("", "/home/me/data/x", "/x"), "(none)");
  EXPECT_EQ(root_of("", "/home/me/data/a/x", "a//x"), "(none)");
  EXPECT_EQ(root_of("", "", "x"), "(none)");
  // Too long for the caller's buffer, or for a path at all: nothing, no overflow.
  EXPECT_EQ(root_of("", "/home/me/data/x", "x", 13), "(none)");
  EXPECT_EQ(root_of("", "/home/me/data/x", "x", 14), "/home/me/data");
  std::string deep(3 * PATH_MAX, 'a');
  EXPECT_EQ(root_of("/" + deep, deep + "/x", "x"), "(none)");
}

}  // namespace
}  // namespace monarch
