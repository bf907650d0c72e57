#include "cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>
extern "C" {
#include <sys/pidfd.h>
}

#include <cerrno>
#include <set>
#include <sstream>

#include "fd.h"

namespace monarch::spank {
namespace {

constexpr const char* kCgroupRoot = "/sys/fs/cgroup/";
constexpr const char* kLeaf = "monarch";
constexpr size_t kMaxRead = 1 << 20;

std::string read_file(const std::string& path) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::string text;
  if (!fd) return text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd.get(), buf, sizeof buf)) > 0 && text.size() < kMaxRead)
    text.append(buf, size_t(n));
  return text;
}

bool write_file(const std::string& path, const std::string& text) {
  Fd fd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
  return fd && write(fd.get(), text.data(), text.size()) == ssize_t(text.size());
}

std::set<std::string> split(const std::string& s, char sep) {
  std::set<std::string> out;
  std::istringstream in(s);
  std::string part;
  while (std::getline(in, part, sep))
    if (!part.empty()) out.insert(part);
  return out;
}

struct CgroupMount {
  std::string point, root;
  bool v2 = false;
  std::set<std::string> options;  // v1: the controllers among the super options
};

std::vector<CgroupMount> cgroup_mounts() {
  std::vector<CgroupMount> mounts;
  std::istringstream in(read_file("/proc/self/mountinfo"));
  std::string line;
  while (std::getline(in, line)) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
    std::string id, parent, devno, root, point, type, source, super;
    head >> id >> parent >> devno >> root >> point;
    tail >> type >> source >> super;
    if ((type != "cgroup" && type != "cgroup2") || !point.starts_with(kCgroupRoot)) continue;
    mounts.push_back({point, root, type == "cgroup2", split(super, ',')});
  }
  return mounts;
}

// A line of /proc/self/cgroup, "ID:CONTROLLERS:PATH", on disk.
const CgroupMount* mount_of(const std::vector<CgroupMount>& mounts, const std::string& id,
                            const std::string& controllers) {
  for (const CgroupMount& m : mounts) {
    if (id == "0") {
      if (m.v2) return &m;
      continue;
    }
    if (m.v2) continue;
    bool all = !controllers.empty();
    for (const std::string& c : split(controllers, ',')) all &= m.options.count(c) > 0;
    if (all) return &m;
  }
  return nullptr;
}

// Is `pid` listed in `procs` (the text of a cgroup.procs file)?
bool listed(const std::string& procs, pid_t pid) {
  std::istringstream in(procs);
  long p;
  while (in >> p)
    if (p == pid) return true;
  return false;
}

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Kills what is in `leaf`, only processes still listed there once a pidfd
// holds them (so a pid reused meanwhile is never signalled). True when the
// leaf is empty.
bool kill_members(const std::string& leaf, int& killed) {
  std::string procs_path = leaf + "/cgroup.procs";
  write_file(leaf + "/cgroup.kill", "1");  // v2 (Linux 5.14+): all at once
  std::string procs = read_file(procs_path);
  std::istringstream in(procs);
  long pid;
  bool any = false;
  while (in >> pid) {
    any = true;
    Fd fd(pidfd_open(pid_t(pid), 0));
    if (fd && listed(read_file(procs_path), pid_t(pid)) &&
        pidfd_send_signal(fd.get(), SIGKILL, nullptr, 0) == 0)
      killed++;
  }
  return !any;
}

}  // namespace

std::vector<CgroupJoin> job_cgroup_leaves(uint32_t job_id) {
  std::vector<CgroupJoin> leaves;
  std::vector<CgroupMount> mounts = cgroup_mounts();
  std::string component = "/job_" + std::to_string(job_id);
  std::istringstream in(read_file("/proc/self/cgroup"));
  std::string line;
  while (std::getline(in, line)) {
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    size_t at = path.find(component);
    while (at != std::string::npos && at + component.size() < path.size() &&
           path[at + component.size()] != '/')
      at = path.find(component, at + 1);
    if (at == std::string::npos) continue;  // the job has no cgroup in this hierarchy
    const CgroupMount* m = mount_of(mounts, id, controllers);
    if (!m) continue;
    std::string job = path.substr(0, at + component.size());
    if (m->root != "/") {
      if (!job.starts_with(m->root)) continue;
      job = job.substr(m->root.size());
    }
    std::string job_dir = m->point + job;
    CgroupJoin join{.dir = job_dir + "/" + kLeaf};
    if (!m->v2 && m->options.count("cpuset"))
      for (const char* f : {"cpuset.cpus", "cpuset.mems"})
        join.copy.emplace_back(job_dir + "/" + f, join.dir + "/" + f);
    leaves.push_back(std::move(join));
  }
  return leaves;
}

int remove_job_cgroups(const std::vector<std::string>& leaves, unsigned timeout_s) {
  int killed = 0;
  int64_t deadline = now_ms() + int64_t(timeout_s) * 1000;
  for (const std::string& leaf : leaves) {
    if (!leaf.starts_with(kCgroupRoot) || !leaf.ends_with(std::string("/") + kLeaf)) continue;
    while (!kill_members(leaf, killed) && now_ms() < deadline) {
      timespec pause = {0, 20'000'000};
      nanosleep(&pause, nullptr);
    }
    if (rmdir(leaf.c_str()) != 0) continue;
    // Slurm's own directories above, which it could not remove while the
    // leaf was there: only if empty (rmdir says so), only these names.
    std::string dir = leaf.substr(0, leaf.rfind('/'));
    for (const char* prefix : {"job_", "uid_"}) {
      std::string name = dir.substr(dir.rfind('/') + 1);
      if (!name.starts_with(prefix) || rmdir(dir.c_str()) != 0) break;
      dir = dir.substr(0, dir.rfind('/'));
    }
  }
  return killed;
}

}  // namespace monarch::spank
