// The job's Monarch cgroup (spank/cgroup.h) against real hierarchies: a
// Slurm-like job cgroup is made in each cgroup file system this machine
// mounts (cgroup v1's memory and cpuset hierarchies, as cgroup/v1 makes
// "uid_U/job_J/step_0"; the v2 unified hierarchy, as cgroup/v2 makes
// "system.slice/slurmstepd.scope/job_J/step_0"); a process in the step
// finds the job's leaves and starts a "stager" (two processes) in them with
// fork_as_user, as slurmstepd does; then the job's end reads the leaves'
// charge, kills them and removes them. As root only (skipped otherwise).
// The parsing of /proc/self/cgroup and mountinfo is tested on texts.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "cgroup.h"

namespace monarch::spank {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// What a pipe's writers wrote, to its end (a child writes in pieces); closes it.
std::string read_all(int fd) {
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) text.append(buf, size_t(n));
  close(fd);
  return text;
}

bool put(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  return bool(out);
}

// ---- parsing (no root needed) ----

constexpr const char* kMountinfo =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    "50 23 0:40 / /tmp/elsewhere rw,relatime - cgroup cgroup rw,pids\n";

TEST(CgroupParse, FindsTheJobInEveryHierarchyWhereItHasOne) {
  std::string cgroup =
      "5:pids:/slurm/uid_1000/job_42/step_0\n"  // mounted outside /sys/fs/cgroup/: ignored
      "4:memory:/slurm/uid_1000/job_42/step_batch/user/task_0\n"
      "3:cpuset:/slurm/uid_1000/job_42/step_0\n"
      "2:cpu,cpuacct:/\n"  // no job cgroup in this one
      "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n";
  EXPECT_EQ(
      job_cgroup_dirs(42, cgroup, kMountinfo),
      (std::vector<std::string>{"/sys/fs/cgroup/memory/slurm/uid_1000/job_42",
                                "/sys/fs/cgroup/cpuset/slurm/uid_1000/job_42",
                                "/sys/fs/cgroup/unified/system.slice/slurmstepd.scope/job_42"}));
}

TEST(CgroupParse, AnotherJobWhoseIdStartsTheSameIsNotThisJob) {
  std::string cgroup =
      "0::/system.slice/slurmstepd.scope/job_421/step_0\n"
      "4:memory:/slurm/uid_1/job_42x/step_0\n";
  EXPECT_TRUE(job_cgroup_dirs(42, cgroup, kMountinfo).empty());
}

TEST(CgroupParse, AMountOfASubtreeIsFollowed) {
  // A container (or a cgroup namespace) that mounts only the node's subtree.
  std::string mountinfo =
      "41 31 0:38 /system.slice /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n";
  std::string cgroup = "0::/system.slice/slurmstepd.scope/job_7/step_0\n";
  EXPECT_EQ(job_cgroup_dirs(7, cgroup, mountinfo),
            (std::vector<std::string>{"/sys/fs/cgroup/slurmstepd.scope/job_7"}));
  std::string outside = "0::/other.slice/job_7/step_0\n";
  EXPECT_TRUE(job_cgroup_dirs(7, outside, mountinfo).empty());
}

TEST(CgroupParse, AMountRootIsAWholePathComponent) {
  // A process in "/system.slice2" is outside a mount of "/system.slice".
  std::string mountinfo =
      "41 31 0:38 /system.slice /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n";
  EXPECT_TRUE(job_cgroup_dirs(7, "0::/system.slice2/job_7/step_0\n", mountinfo).empty());
  // The job's own cgroup as the mount's root (a container given the job).
  std::string job = "41 31 0:38 /slurm/job_7 /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(job_cgroup_dirs(7, "0::/slurm/job_7/step_0\n", job),
            (std::vector<std::string>{"/sys/fs/cgroup"}));
}

TEST(CgroupParse, NoCgroupFileSystemNoLeaf) {
  EXPECT_TRUE(job_cgroup_dirs(42, "0::/job_42/step_0\n", "").empty());
  EXPECT_EQ(cgroup_version("/proc"), CgroupVersion::kNone);
}

// ---- real hierarchies (root) ----

struct Hierarchy {
  std::string mount;
  CgroupVersion version;
  std::string controller;  // v1: the one controller it was found by; v2: ""
};

// Read here, not with the parser under test: a mount that parser missed
// then fails a test instead of leaving it fewer hierarchies to try (a v2
// mounted at /sys/fs/cgroup itself was such a mount).
// The hierarchies to try: v1 memory, cpuset and freezer (proctrack/cgroup's)
// where this machine mounts them, and the v2 unified hierarchy (below /sys/fs/cgroup/ or at it).
std::vector<Hierarchy> hierarchies() {
  std::vector<Hierarchy> out;
  std::istringstream in(slurp("/proc/self/mountinfo"));
  std::string line;
  while (std::getline(in, line)) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
    std::string id, parent, devno, root, point, type, source, super;
    head >> id >> parent >> devno >> root >> point;
    tail >> type >> source >> super;
    if (root != "/" || !(point + "/").starts_with("/sys/fs/cgroup/")) continue;
    if (type == "cgroup2") out.push_back({point, CgroupVersion::kV2, ""});
    for (const char* c : {"memory", "cpuset", "freezer"})
      if (type == "cgroup" &&
          ("," + super + ",").find(std::string(",") + c + ",") != std::string::npos)
        out.push_back({point, CgroupVersion::kV1, c});
  }
  return out;
}

class CgroupReal : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (makes cgroups)";
    job_ = 900000000 + uint32_t(getpid());
    base_ = "monarch-unit-" + std::to_string(getpid());
    for (const Hierarchy& h : hierarchies()) {
      // As Slurm's plugins lay a job out: v1 "uid_U/job_J/step_S", v2
      // "system.slice/slurmstepd.scope/job_J/step_S".
      std::vector<std::string> parts =
          h.version == CgroupVersion::kV2
              ? std::vector<std::string>{base_, "system.slice", "slurmstepd.scope",
                                         "job_" + std::to_string(job_), "step_0"}
              : std::vector<std::string>{base_, "uid_0", "job_" + std::to_string(job_), "step_0"};
      std::string dir = h.mount;
      for (const std::string& part : parts) {
        std::string parent = dir;
        dir += "/" + part;
        ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << dir << ": " << strerror(errno);
        made_.push_back(dir);
        if (h.controller == "cpuset") {  // a v1 cpuset starts empty
          for (const char* f : {"cpuset.cpus", "cpuset.mems"})
            ASSERT_TRUE(put(dir + "/" + f, slurp(parent + "/" + f))) << dir;
        }
      }
      steps_.push_back(dir);
      jobs_[h.mount] = dir.substr(0, dir.rfind('/'));
      found_.push_back(h);
    }
    if (found_.empty()) GTEST_SKIP() << "no cgroup hierarchy mounted below /sys/fs/cgroup";
    // Orphans (the "stager", once its starter exits) come to this process.
    ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  }

  void TearDown() override {
    signal(SIGCHLD, SIG_DFL);
    // Whatever a test left in the leaves (a process whose pid changes, a
    // frozen one): v2's cgroup.kill, or v1's freezer frozen, killed, thawed.
    for (int i = 0; i < 50; i++) {
      bool any = false;
      for (const Hierarchy& h : found_) {
        std::string leaf = jobs_[h.mount] + "/monarch";
        if (h.version == CgroupVersion::kV2) put(leaf + "/cgroup.kill", "1");
        if (h.controller == "freezer") put(leaf + "/freezer.state", "FROZEN");
        usleep(20'000);
        for (pid_t pid : in_leaf(leaf)) kill(pid, SIGKILL), any = true;
        if (h.controller == "freezer") put(leaf + "/freezer.state", "THAWED");
      }
      if (!any) break;
      usleep(20'000);
    }
    for (pid_t pid : stager_) kill(pid, SIGKILL);
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    for (const Hierarchy& h : found_) rmdir((jobs_[h.mount] + "/monarch").c_str());
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) rmdir(it->c_str());
    prctl(PR_SET_CHILD_SUBREAPER, 0);
  }

  // What slurmstepd does in user_init: a process in the job's step cgroups
  // finds the leaves and starts the stager in them. Returns the leaves; the
  // stager's pids in stager_.
  std::vector<CgroupJoin> start_stager(const char* script = "sleep 600 & exec sleep 600") {
    int p[2];
    EXPECT_EQ(pipe(p), 0);
    pid_t stepd = fork();
    if (stepd == 0) {
      close(p[0]);
      for (const std::string& step : steps_)
        if (!put(step + "/cgroup.procs", "0")) _exit(3);
      std::vector<CgroupJoin> leaves = job_cgroup_leaves(job_);
      std::string text;
      for (const CgroupJoin& j : leaves)
        text += "leaf " + j.dir + " " + std::to_string(j.copy.size()) + "\n";
      ChildSetup setup{.cgroups = leaves};
      int err[2];
      if (pipe(err) != 0) _exit(4);
      pid_t stager = fork_as_user(setup, err[1]);
      if (stager == 0) {
        execl("/bin/sh", "sh", "-c", script, nullptr);
        _exit(127);
      }
      close(err[1]);
      std::string why = read_all(err[0]);
      if (!why.empty()) text += "error " + why;
      text += "stager " + std::to_string(stager) + "\n";
      (void)!write(p[1], text.data(), text.size());
      _exit(0);
    }
    close(p[1]);
    std::string text = read_all(p[0]);
    int status = 0;
    EXPECT_EQ(waitpid(stepd, &status, 0), stepd);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    std::vector<CgroupJoin> leaves;
    std::istringstream in(text);
    std::string word;
    while (in >> word) {
      if (word == "leaf") {
        CgroupJoin j;
        size_t copies;
        in >> j.dir >> copies;
        j.copy.resize(copies);
        leaves.push_back(j);
      } else if (word == "stager") {
        pid_t pid;
        in >> pid;
        stager_.push_back(pid);
      } else {
        ADD_FAILURE() << "the stager's set-up failed: " << text;
        break;
      }
    }
    return leaves;
  }

  // The pids of this process's children that are in `leaf`.
  std::vector<pid_t> in_leaf(const std::string& leaf) {
    std::vector<pid_t> pids;
    std::istringstream in(slurp(leaf + "/cgroup.procs"));
    pid_t pid;
    while (in >> pid) pids.push_back(pid);
    return pids;
  }

  uint32_t job_ = 0;
  std::string base_;
  std::vector<Hierarchy> found_;
  std::vector<std::string> made_, steps_;
  std::map<std::string, std::string> jobs_;  // mount -> job dir
  std::vector<pid_t> stager_;
};

TEST_F(CgroupReal, TheStagerRunsInTheJobsLeafAndDiesWithIt) {
  std::vector<CgroupJoin> leaves = start_stager();
  ASSERT_EQ(stager_.size(), 1u);
  ASSERT_EQ(leaves.size(), found_.size()) << "a leaf in each hierarchy where the job has a cgroup";
  std::vector<std::string> paths;
  for (const Hierarchy& h : found_) {
    std::string leaf = jobs_[h.mount] + "/monarch";
    paths.push_back(leaf);
    auto it = std::find_if(leaves.begin(), leaves.end(),
                           [&](const CgroupJoin& j) { return j.dir == leaf; });
    ASSERT_NE(it, leaves.end()) << "no leaf " << leaf;
    EXPECT_EQ(cgroup_version(leaf), h.version) << leaf;
    // v1's cpuset leaf takes the job's CPUs and memory nodes first; v2 inherits them.
    EXPECT_EQ(it->copy.size(), h.controller == "cpuset" ? 2u : 0u) << leaf;
    if (h.controller == "cpuset") {
      EXPECT_EQ(slurp(leaf + "/cpuset.cpus"), slurp(jobs_[h.mount] + "/cpuset.cpus"));
    }
  }
  // The stager and the process it started are both in every leaf (the
  // shell forks before it execs: wait for both).
  for (int i = 0; i < 500 && in_leaf(paths[0]).size() < 2; i++) usleep(10'000);
  for (const std::string& leaf : paths) {
    std::vector<pid_t> pids = in_leaf(leaf);
    EXPECT_EQ(pids.size(), 2u) << leaf;
    EXPECT_NE(std::find(pids.begin(), pids.end(), stager_[0]), pids.end()) << leaf;
  }
  // The charge: v1's memory hierarchy, and v2 where memory is a controller
  // of the leaf; none elsewhere.
  for (const Hierarchy& h : found_) {
    std::string leaf = jobs_[h.mount] + "/monarch";
    bool memory =
        h.version == CgroupVersion::kV2
            ? (" " + slurp(leaf + "/cgroup.controllers")).find(" memory") != std::string::npos
            : h.controller == "memory";
    std::optional<uint64_t> peak = memory_peak(leaf, h.version);
    EXPECT_EQ(peak.has_value(), memory) << leaf;
    if (memory) {
      EXPECT_GT(*peak, 0u) << leaf;
    }
  }

  // The job's end: Slurm has removed its step cgroups (they are empty).
  for (const std::string& step : steps_) ASSERT_EQ(rmdir(step.c_str()), 0) << step;
  RemovedCgroups removed = remove_job_cgroups(paths, 10);
  EXPECT_EQ(removed.killed, 2);
  for (int reaped = 0; reaped < 2;) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    ASSERT_GT(pid, 0) << "a process of the leaf is not this process's";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << pid << " " << status;
    reaped++;
  }
  stager_.clear();
  for (const Hierarchy& h : found_) {
    EXPECT_NE(access((jobs_[h.mount] + "/monarch").c_str(), F_OK), 0) << "the leaf is left";
    EXPECT_NE(access(jobs_[h.mount].c_str(), F_OK), 0) << "the job's cgroup is left";
    std::string above = jobs_[h.mount].substr(0, jobs_[h.mount].rfind('/'));
    // v1: the user's cgroup "uid_0" went with it; v2: slurmstepd.scope stays.
    EXPECT_EQ(access(above.c_str(), F_OK) == 0, h.version == CgroupVersion::kV2) << above;
  }
}

TEST_F(CgroupReal, AnEmptyLeafIsRemovedAndNothingElse) {
  for (const Hierarchy& h : found_) {
    std::string leaf = jobs_[h.mount] + "/monarch";
    ASSERT_EQ(mkdir(leaf.c_str(), 0755), 0) << leaf;
    EXPECT_TRUE(leaf_empty(leaf, h.version));
  }
  std::vector<std::string> paths;
  for (const Hierarchy& h : found_) paths.push_back(jobs_[h.mount] + "/monarch");
  // Names that are not a Monarch leaf below /sys/fs/cgroup/ are not touched.
  std::vector<std::string> others{jobs_[found_[0].mount], "/tmp/monarch",
                                  steps_[0] + "/../monarch-not"};
  EXPECT_EQ(remove_job_cgroups(others, 1).killed, 0);
  EXPECT_EQ(access(jobs_[found_[0].mount].c_str(), F_OK), 0);
  RemovedCgroups removed = remove_job_cgroups(paths, 1);
  EXPECT_EQ(removed.killed, 0);
  for (const std::string& leaf : paths) EXPECT_NE(access(leaf.c_str(), F_OK), 0) << leaf;
  // The step cgroups are still there, so the jobs' cgroups stay.
  for (const Hierarchy& h : found_) EXPECT_EQ(access(jobs_[h.mount].c_str(), F_OK), 0);
}

// The leaves a node of this version would have: Slurm's cgroup/v1 makes no
// job cgroup in the unified hierarchy beside the v1 ones, so where v1
// hierarchies are found, those alone.
std::vector<std::string> node_leaves(const std::vector<Hierarchy>& found,
                                     std::map<std::string, std::string>& jobs) {
  bool v1 = std::any_of(found.begin(), found.end(),
                        [](const Hierarchy& h) { return h.version == CgroupVersion::kV1; });
  std::vector<std::string> leaves;
  for (const Hierarchy& h : found)
    if (!v1 || h.version == CgroupVersion::kV1) leaves.push_back(jobs[h.mount] + "/monarch");
  return leaves;
}

TEST_F(CgroupReal, AProcessThatForksFastDoesNotOutliveTheJob) {
  // Each process forks and exits at once: its pid is never the same for
  // long (a user can make their stager do this with ptrace).
  start_stager("exec perl -e 'for (1..15) { last unless fork } while (1) { exit if fork }'");
  ASSERT_EQ(stager_.size(), 1u);
  signal(SIGCHLD, SIG_IGN);  // the chain's orphans come here: reap them
  std::vector<std::string> leaves = node_leaves(found_, jobs_);
  for (int i = 0; i < 500 && in_leaf(leaves[0]).empty(); i++) usleep(10'000);
  for (const std::string& step : steps_) ASSERT_EQ(rmdir(step.c_str()), 0) << step;
  RemovedCgroups removed = remove_job_cgroups(leaves, 5);
  for (const std::string& leaf : leaves) {
    EXPECT_NE(access(leaf.c_str(), F_OK), 0) << leaf << ": left, with " << in_leaf(leaf).size()
                                             << " process(es) alive after the job's end";
  }
  EXPECT_TRUE(removed.left.empty());
  EXPECT_GT(removed.killed, 0);
}

// Slurm's v1 plugins make the job's cgroup the user's: a "monarch" the user
// made there first (and whose cgroup.procs the user owns) is not joined.
TEST_F(CgroupReal, ALeafTheUserMadeFirstIsNotJoined) {
  std::vector<CgroupJoin> joins;
  for (const Hierarchy& h : found_) {
    std::string leaf = jobs_[h.mount] + "/monarch";
    ASSERT_EQ(mkdir(leaf.c_str(), 0755), 0) << leaf;
    ASSERT_EQ(chown(leaf.c_str(), 65534, 65534), 0) << leaf;
    joins.push_back(leaf_join(jobs_[h.mount], h.version));
  }
  int err[2];
  ASSERT_EQ(pipe2(err, O_CLOEXEC), 0);
  ChildSetup setup{.cgroups = joins};
  pid_t pid = fork_as_user(setup, err[1]);
  if (pid == 0) {
    execl("/bin/true", "true", nullptr);
    _exit(127);
  }
  close(err[1]);
  std::string why = read_all(err[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 126) << status;
  EXPECT_NE(why.find("not root's"), std::string::npos) << why;
  for (const Hierarchy& h : found_)
    EXPECT_EQ(slurp(jobs_[h.mount] + "/monarch/cgroup.procs"), "") << h.mount;
}

TEST_F(CgroupReal, ALeafThatCannotBeEmptiedIsReported) {
  std::vector<CgroupJoin> joined = start_stager();
  ASSERT_EQ(stager_.size(), 1u);
  auto freezer = std::find_if(found_.begin(), found_.end(),
                              [](const Hierarchy& h) { return h.controller == "freezer"; });
  if (freezer == found_.end()) GTEST_SKIP() << "no v1 freezer hierarchy here";
  // A process that cannot die yet (as one in uninterruptible sleep on a
  // hung PFS): frozen by a freezer leaf the job's end is not given.
  std::string frozen = jobs_[freezer->mount] + "/monarch";
  for (int i = 0; i < 500 && in_leaf(frozen).size() < 2; i++) usleep(10'000);
  ASSERT_TRUE(put(frozen + "/freezer.state", "FROZEN"));
  std::vector<std::string> leaves;
  for (const Hierarchy& h : found_)
    if (h.controller != "freezer") leaves.push_back(jobs_[h.mount] + "/monarch");
  RemovedCgroups removed = remove_job_cgroups(leaves, 1);
  EXPECT_EQ(removed.left, leaves) << "a leaf the job's end left behind, not reported";
  for (const std::string& leaf : leaves) EXPECT_EQ(access(leaf.c_str(), F_OK), 0) << leaf;
}

TEST(CgroupPeak, MemoryInUseNowIsNotAPeak) {
  // A kernel before 5.19 has memory.current and no memory.peak: what the
  // leaf holds at the job's end is not the most it used.
  char dir[] = "/tmp/monarch-peak-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_TRUE(put(std::string(dir) + "/memory.current", "4096\n"));
  EXPECT_EQ(memory_peak(dir, CgroupVersion::kV2), std::nullopt);
  ASSERT_TRUE(put(std::string(dir) + "/memory.peak", "8192\n"));
  EXPECT_EQ(memory_peak(dir, CgroupVersion::kV2), std::optional<uint64_t>(8192));
  unlink((std::string(dir) + "/memory.current").c_str());
  unlink((std::string(dir) + "/memory.peak").c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace monarch::spank
