// The remover's cost is bounded whatever the tree's shape: a chain of 20,000
// directories with 255-character names, and a wide tree, are deleted by a
// child process allowed 16 descriptors, whose peak memory is then checked.
// (The recursive remover this replaced held a descriptor, a directory stream
// and a full path per level: it failed with EMFILE at depth 12 here, and at
// depth 19,000 it crashed on its stack.)
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fd.h"
#include "remove_tree.h"
#include "sanitized.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;

class Scratch {
 public:
  Scratch() {
    char name[] = "/tmp/monarch-rmb-XXXXXX";
    path_ = mkdtemp(name);
  }
  ~Scratch() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Makes `depth` nested directories named by 255 copies of a letter under
// `top`, with a file at the bottom.
void make_chain(const fs::path& top, int depth) {
  ASSERT_EQ(mkdir(top.c_str(), 0755), 0);
  Fd dir(open(top.c_str(), O_RDONLY | O_DIRECTORY));
  std::string name(255, 'd');
  for (int i = 0; i < depth; ++i) {
    name[0] = char('a' + i % 26);
    ASSERT_EQ(mkdirat(dir.get(), name.c_str(), 0755), 0) << "depth " << i;
    dir = Fd(openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY));
    ASSERT_TRUE(dir);
  }
  Fd f(openat(dir.get(), "bottom", O_CREAT | O_WRONLY, 0644));
  ASSERT_TRUE(f);
}

struct ChildRun {
  RemoveResult result;  // as the child saw it (counts only)
  long max_rss_kib = 0;
  bool exited = false;
};

// Runs remove_tree in a child limited to `max_fds` descriptors; its peak
// memory comes from getrusage.
ChildRun remove_in_child(const fs::path& path, rlim_t max_fds) {
  int p[2];
  EXPECT_EQ(pipe(p), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    struct rlimit lim = {max_fds, max_fds};
    setrlimit(RLIMIT_NOFILE, &lim);
    RemoveResult r = remove_tree(path.string());
    uint64_t out[3] = {r.removed, r.mounts, r.errors};
    (void)!write(p[1], out, sizeof out);
    _exit(0);
  }
  close(p[1]);
  uint64_t in[3] = {0, 0, ~0ull};
  ChildRun run;
  run.exited = read(p[0], in, sizeof in) == sizeof in;
  close(p[0]);
  int status = 0;
  struct rusage ru = {};
  wait4(pid, &status, 0, &ru);
  run.exited = run.exited && WIFEXITED(status);
  run.result.removed = in[0], run.result.mounts = in[1], run.result.errors = in[2];
  run.max_rss_kib = ru.ru_maxrss;
  return run;
}

TEST(RemoveBounded, DeepChainOfLongNames) {
  Scratch s;
  fs::path top = s.path() / "job";
  constexpr int kDepth = 20000;
  make_chain(top, kDepth);
  ChildRun run = remove_in_child(top, 16);
  ASSERT_TRUE(run.exited) << "the remover crashed";
  EXPECT_EQ(run.result.errors, 0u);
  EXPECT_EQ(run.result.removed, uint64_t(kDepth) + 2);  // the chain, the file, the top
  EXPECT_FALSE(fs::exists(fs::symlink_status(top)));
  // The test binary itself takes a few MiB; the chain would take hundreds.
  if (!kSanitized) {
    EXPECT_LT(run.max_rss_kib, 32 * 1024);
  }
}

TEST(RemoveBounded, WideTreeWithLinksOut) {
  Scratch s;
  fs::path top = s.path() / "job", victim = s.path() / "victim";
  fs::create_directories(victim);
  std::ofstream(victim / "keep") << "precious";
  fs::create_directories(top);
  for (int d = 0; d < 200; ++d) {
    fs::path sub = top / ("dir" + std::to_string(d)) / "inner";
    fs::create_directories(sub);
    for (int f = 0; f < 50; ++f) std::ofstream(sub / ("f" + std::to_string(f)));
    fs::create_directory_symlink(victim, sub / "out");
  }
  for (int f = 0; f < 20000; ++f) std::ofstream(top / ("flat" + std::to_string(f)));
  ChildRun run = remove_in_child(top, 16);
  ASSERT_TRUE(run.exited);
  EXPECT_EQ(run.result.errors, 0u);
  EXPECT_EQ(run.result.removed, 200u * (2 + 50 + 1) + 20000 + 1);
  EXPECT_FALSE(fs::exists(fs::symlink_status(top)));
  EXPECT_TRUE(fs::exists(victim / "keep"));
}

}  // namespace
}  // namespace monarch
