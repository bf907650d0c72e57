#include "cgroup.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>
extern "C" {
#include <sys/pidfd.h>
}

#include <algorithm>
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

std::vector<pid_t> members(const std::string& leaf) {
  std::vector<pid_t> pids;
  std::istringstream in(read_file(leaf + "/cgroup.procs"));
  long pid;
  while (in >> pid) pids.push_back(pid_t(pid));
  return pids;
}

// The number after "KEY " in a flat keyed file (cgroup.events, memory.stat).
std::optional<uint64_t> keyed_value(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string k;
  uint64_t v;
  while (in >> k >> v)
    if (k == key) return v;
  return std::nullopt;
}

std::optional<uint64_t> number_in(const std::string& path) {
  std::string text = read_file(path);
  if (text.empty() || text[0] < '0' || text[0] > '9') return std::nullopt;
  return std::stoull(text);
}

struct CgroupMount {
  std::string point, root;
  bool v2 = false;
  std::set<std::string> options;  // v1: the controllers among the super options
};

std::vector<CgroupMount> cgroup_mounts(const std::string& mountinfo) {
  std::vector<CgroupMount> mounts;
  std::istringstream in(mountinfo);
  std::string line;
  while (std::getline(in, line)) {
    size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash)), tail(line.substr(dash + 3));
    std::string id, parent, devno, root, point, type, source, super;
    head >> id >> parent >> devno >> root >> point;
    tail >> type >> source >> super;
    // Below /sys/fs/cgroup/ (v1, and v2 beside it) or at it (v2 alone, as
    // every current distribution mounts it).
    if ((type != "cgroup" && type != "cgroup2") || !(point + "/").starts_with(kCgroupRoot))
      continue;
    mounts.push_back({point, root, type == "cgroup2", split(super, ',')});
  }
  return mounts;
}

// The mount of the hierarchy of a /proc/self/cgroup line "ID:CONTROLLERS:PATH".
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

// Signals each listed process once a pidfd holds it and it is still listed
// (so a pid reused meanwhile is never signalled: the pidfd would name the
// process that exited).
void kill_listed(const std::string& leaf) {
  std::vector<std::pair<pid_t, Fd>> held;
  for (pid_t pid : members(leaf)) {
    Fd fd(pidfd_open(pid, 0));
    if (fd) held.emplace_back(pid, std::move(fd));
  }
  std::vector<pid_t> now = members(leaf);
  for (const auto& [pid, fd] : held)
    if (std::find(now.begin(), now.end(), pid) != now.end())
      pidfd_send_signal(fd.get(), SIGKILL, nullptr, 0);
}

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace

CgroupVersion cgroup_version(const std::string& dir) {
  struct statfs fs;
  if (statfs(dir.c_str(), &fs) != 0) return CgroupVersion::kNone;
  if (fs.f_type == CGROUP2_SUPER_MAGIC) return CgroupVersion::kV2;
  if (fs.f_type == CGROUP_SUPER_MAGIC) return CgroupVersion::kV1;
  return CgroupVersion::kNone;
}

std::vector<std::string> job_cgroup_dirs(uint32_t job_id, const std::string& proc_cgroup,
                                         const std::string& mountinfo) {
  std::vector<std::string> dirs;
  std::vector<CgroupMount> mounts = cgroup_mounts(mountinfo);
  std::string component = "/job_" + std::to_string(job_id);
  std::istringstream in(proc_cgroup);
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
      if (job != m->root && !job.starts_with(m->root + "/")) continue;  // outside the mount
      job = job.substr(m->root.size());
    }
    dirs.push_back(m->point + job);
  }
  return dirs;
}

CgroupJoin leaf_join(const std::string& job_dir, CgroupVersion version) {
  CgroupJoin join{.dir = job_dir + "/" + kLeaf};
  if (version == CgroupVersion::kV1 && access((job_dir + "/cpuset.cpus").c_str(), F_OK) == 0)
    for (const char* f : {"cpuset.cpus", "cpuset.mems"})
      join.copy.emplace_back(job_dir + "/" + f, join.dir + "/" + f);
  return join;
}

std::vector<CgroupJoin> job_cgroup_leaves(uint32_t job_id) {
  std::vector<CgroupJoin> leaves;
  for (const std::string& dir :
       job_cgroup_dirs(job_id, read_file("/proc/self/cgroup"), read_file("/proc/self/mountinfo"))) {
    CgroupVersion version = cgroup_version(dir);
    if (version != CgroupVersion::kNone) leaves.push_back(leaf_join(dir, version));
  }
  return leaves;
}

std::optional<uint64_t> memory_peak(const std::string& leaf, CgroupVersion version) {
  switch (version) {
    case CgroupVersion::kV1:
      return number_in(leaf + "/memory.max_usage_in_bytes");
    case CgroupVersion::kV2:
      return number_in(leaf + "/memory.peak");
    case CgroupVersion::kNone:
      break;
  }
  return std::nullopt;
}

void kill_leaf(const std::string& leaf, CgroupVersion version) {
  switch (version) {
    case CgroupVersion::kV2:
      if (!write_file(leaf + "/cgroup.kill", "1")) kill_listed(leaf);  // before Linux 5.14
      return;
    case CgroupVersion::kV1:
      kill_listed(leaf);
      return;
    case CgroupVersion::kNone:
      return;
  }
}

bool leaf_empty(const std::string& leaf, CgroupVersion version) {
  switch (version) {
    case CgroupVersion::kV2:
      if (auto populated = keyed_value(read_file(leaf + "/cgroup.events"), "populated"))
        return *populated == 0;
      return members(leaf).empty();
    case CgroupVersion::kV1:
      return members(leaf).empty();
    case CgroupVersion::kNone:
      break;
  }
  return true;
}

RemovedCgroups remove_job_cgroups(const std::vector<std::string>& leaves, unsigned timeout_s) {
  RemovedCgroups out;
  int64_t deadline = now_ms() + int64_t(timeout_s) * 1000;
  std::vector<std::pair<std::string, CgroupVersion>> mine;
  for (const std::string& leaf : leaves) {
    if (!leaf.starts_with(kCgroupRoot) || !leaf.ends_with(std::string("/") + kLeaf)) continue;
    CgroupVersion version = cgroup_version(leaf);
    if (version == CgroupVersion::kNone) continue;
    if (auto peak = memory_peak(leaf, version))
      out.memory_peak = std::max(out.memory_peak.value_or(0), *peak);
    mine.emplace_back(leaf, version);
  }
  // Every leaf is signalled at least once, all within one deadline (the
  // same processes are in each hierarchy's leaf).
  std::set<pid_t> seen;
  for (bool first = true;; first = false) {
    bool empty = true;
    for (const auto& [leaf, version] : mine) {
      if (leaf_empty(leaf, version)) continue;
      empty = false;
      for (pid_t pid : members(leaf)) seen.insert(pid);
      kill_leaf(leaf, version);
    }
    if (empty || (!first && now_ms() >= deadline)) break;
    timespec pause = {0, 20'000'000};
    nanosleep(&pause, nullptr);
  }
  out.killed = int(seen.size());
  for (const auto& [leaf, version] : mine) {
    if (rmdir(leaf.c_str()) != 0) {
      if (errno != ENOENT) out.left.push_back(leaf);
      continue;
    }
    // Slurm's own directories above, which it could not remove while the
    // leaf was there: only if empty (rmdir says so), only these names.
    std::string dir = leaf.substr(0, leaf.rfind('/'));
    for (const char* prefix : {"job_", "uid_"}) {
      std::string name = dir.substr(dir.rfind('/') + 1);
      if (!name.starts_with(prefix) || rmdir(dir.c_str()) != 0) break;
      dir = dir.substr(0, dir.rfind('/'));
    }
  }
  return out;
}

std::string left_leaf_text(const std::string& leaf, unsigned timeout_s) {
  return leaf + " still has processes " + std::to_string(timeout_s) +
         " s after they were killed; the cgroup is left";
}

}  // namespace monarch::spank
