#include "proc.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fd.h"

namespace monarch::spank {
namespace {

constexpr size_t kMaxProcFile = 64 << 10;  // status and command lines are far smaller

bool read_small_file(const std::string& path, std::string& out) {
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return false;
  out.clear();
  char buf[4096];
  ssize_t n;
  while ((n = read(fd.get(), buf, sizeof buf)) > 0 && out.size() < kMaxProcFile)
    out.append(buf, size_t(n));
  return n >= 0;
}

struct ProcInfo {
  bool zombie = false;
  unsigned long uids[4] = {~0ul, ~0ul, ~0ul, ~0ul};
  std::string exe;
};

bool read_info(pid_t pid, ProcInfo& info) {
  std::string base = "/proc/" + std::to_string(pid), status;
  if (!read_small_file(base + "/status", status)) return false;
  size_t at = 0;
  while (at < status.size()) {
    size_t end = status.find('\n', at);
    if (end == std::string::npos) end = status.size();
    std::string line = status.substr(at, end - at);
    at = end + 1;
    if (line.starts_with("State:") && line.find("zombie") != std::string::npos) info.zombie = true;
    if (line.starts_with("Uid:") && std::sscanf(line.c_str(), "Uid: %lu %lu %lu %lu", &info.uids[0],
                                                &info.uids[1], &info.uids[2], &info.uids[3]) != 4)
      return false;
  }
  char exe[PATH_MAX];
  ssize_t n = readlink((base + "/exe").c_str(), exe, sizeof exe - 1);
  if (n <= 0) return false;
  info.exe.assign(exe, size_t(n));
  return true;
}

bool all_uids(const ProcInfo& info, uid_t uid) {
  for (unsigned long u : info.uids)
    if (u != uid) return false;
  return true;
}

bool runs(const ProcInfo& info, const std::string& program) {
  return info.exe == program || info.exe == program + " (deleted)";
}

std::vector<std::string> argv_of(pid_t pid) {
  std::string cmdline;
  std::vector<std::string> args;
  if (!read_small_file("/proc/" + std::to_string(pid) + "/cmdline", cmdline)) return args;
  for (size_t b = 0; b < cmdline.size();) {
    size_t e = cmdline.find('\0', b);
    if (e == std::string::npos) e = cmdline.size();
    args.push_back(cmdline.substr(b, e - b));
    b = e + 1;
  }
  return args;
}

std::string job_key_of(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--job" && i + 1 < args.size()) return args[i + 1];
    if (args[i].starts_with("--job=")) return args[i].substr(6);
  }
  return "";
}

// Calls f(pid) for every process in /proc.
template <class F>
void each_pid(F&& f) {
  DIR* d = opendir("/proc");
  if (!d) return;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end || pid <= 1) continue;
    f(pid_t(pid));
  }
  closedir(d);
}

}  // namespace

bool is_job_stager(pid_t pid, const std::string& program, uid_t uid, const std::string& key) {
  ProcInfo info;
  if (!read_info(pid, info) || info.zombie || !all_uids(info, uid) || !runs(info, program))
    return false;
  return job_key_of(argv_of(pid)) == key;
}

std::vector<pid_t> find_job_stagers(const std::string& program, uid_t uid, const std::string& key) {
  std::vector<pid_t> found;
  each_pid([&](pid_t pid) {
    if (is_job_stager(pid, program, uid, key)) found.push_back(pid);
  });
  return found;
}

LiveJobs live_jobs(const std::string& program) {
  LiveJobs live;
  each_pid([&](pid_t pid) {
    ProcInfo info;
    if (!read_info(pid, info) || info.zombie) return;
    if (runs(info, program)) {
      std::string key = job_key_of(argv_of(pid));
      if (!key.empty() && all_uids(info, uid_t(info.uids[0])))
        live.stagers.insert({key, uid_t(info.uids[0])});
      return;
    }
    size_t slash = info.exe.rfind('/');
    std::string name = info.exe.substr(slash == std::string::npos ? 0 : slash + 1);
    // Debian installs it as slurmstepd-wlm.
    if (!name.starts_with("slurmstepd") || !all_uids(info, 0)) return;
    // slurmstepd writes its title over its argv: "slurmstepd: [ID.STEP]".
    std::string title;
    if (!read_small_file("/proc/" + std::to_string(pid) + "/cmdline", title)) return;
    constexpr std::string_view kTitle = "slurmstepd: [";
    if (!title.starts_with(kTitle)) return;
    char* end = nullptr;
    unsigned long job = std::strtoul(title.c_str() + kTitle.size(), &end, 10);
    if (end != title.c_str() + kTitle.size() && job > 0 && job <= UINT32_MAX)
      live.stepd_jobs.insert(uint32_t(job));
  });
  return live;
}

std::string boot_id() {
  std::string id;
  if (!read_small_file("/proc/sys/kernel/random/boot_id", id)) return "";
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
}

}  // namespace monarch::spank
