#include "record.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "fd.h"

namespace monarch::spank {
namespace {

constexpr size_t kMaxRecordBytes = 64 << 10;  // a record is a few hundred bytes
constexpr const char* kCgroupSuffix = ".cgroups";
constexpr const char* kTempSuffix = ".new";

std::string read_small(int dirfd, const std::string& name, bool& found) {
  found = false;
  Fd fd(openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) return "";
  found = true;
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd.get(), buf, sizeof buf)) > 0 && text.size() < kMaxRecordBytes)
    text.append(buf, size_t(n));
  return text;
}

bool parse_number(const std::string& v, unsigned long long& out, int base = 10) {
  if (v.empty()) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(v.c_str(), &end, base);
  return !errno && *end == 0;
}

}  // namespace

std::string cgroup_record_name(const std::string& key) {
  return key + kCgroupSuffix;
}

void write_record(int jobs_fd, const JobRecord& r) {
  std::ostringstream o;
  o << "# What the Monarch Slurm plugin made for this job on this tier (root's; do not edit)\n"
    << "version=1\n"
    << "key=" << r.key << "\n"
    << "space=" << (r.space == JobSpace::kImage ? "image" : "directory") << "\n"
    << "uid=" << r.uid << "\n"
    << "gid=" << r.gid << "\n"
    << "groups=";
  for (size_t i = 0; i < r.groups.size(); ++i) o << (i ? "," : "") << r.groups[i];
  char umask[8];
  std::snprintf(umask, sizeof umask, "%04o", unsigned(r.umask & 0777));
  o << "\numask=" << umask << "\nuser=" << r.user << "\nhome=" << r.home << "\nboot=" << r.boot
    << "\nrestarts=" << r.restarts << "\nmount_id=" << r.mount_id << "\n";
  std::string text = o.str(), tmp = r.key + kTempSuffix;
  Fd fd(openat(jobs_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600));
  bool ok = fd && write(fd.get(), text.data(), text.size()) == ssize_t(text.size()) &&
            fsync(fd.get()) == 0;
  int e = errno;
  fd.reset();
  if (ok && renameat(jobs_fd, tmp.c_str(), jobs_fd, r.key.c_str()) == 0) return;
  if (ok) e = errno;
  unlinkat(jobs_fd, tmp.c_str(), 0);
  throw std::runtime_error("cannot write the record of " + r.key + ": " + std::strerror(e));
}

std::optional<JobRecord> read_record(int jobs_fd, const std::string& key) {
  bool found;
  std::string text = read_small(jobs_fd, key, found);
  if (!found) return std::nullopt;
  JobRecord r{.key = key};
  bool ok = true, have_uid = false, have_space = false;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    size_t eq = line.find('=');
    if (eq == std::string::npos) {
      ok = false;
      continue;
    }
    std::string name = line.substr(0, eq), value = line.substr(eq + 1);
    unsigned long long n = 0;
    if (name == "space") {
      have_space = value == "image" || value == "directory";
      r.space = value == "image" ? JobSpace::kImage : JobSpace::kDirectory;
    } else if (name == "uid") {
      ok &= have_uid = parse_number(value, n);
      r.uid = uid_t(n);
    } else if (name == "gid") {
      ok &= parse_number(value, n);
      r.gid = gid_t(n);
    } else if (name == "groups") {
      std::istringstream g(value);
      std::string one;
      while (std::getline(g, one, ','))
        if (parse_number(one, n)) r.groups.push_back(gid_t(n));
    } else if (name == "umask") {
      ok &= parse_number(value, n, 8);
      r.umask = mode_t(n & 0777);
    } else if (name == "user") {
      r.user = value;
    } else if (name == "home") {
      r.home = value;
    } else if (name == "boot") {
      r.boot = value;
    } else if (name == "restarts") {
      ok &= parse_number(value, n);
      r.restarts = uint32_t(n);
    } else if (name == "mount_id") {
      ok &= parse_number(value, n);
      r.mount_id = n;
    }
  }
  if (!ok || !have_uid || !have_space) {
    // Damaged: keep what names the space, mark it stale.
    JobRecord stale{.key = key, .space = r.space};
    return stale;
  }
  return r;
}

std::vector<std::string> record_keys(int jobs_fd, size_t limit) {
  std::vector<std::string> keys;
  DIR* d = fdopendir(openat(jobs_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!d) return keys;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == ".." || n.ends_with(kCgroupSuffix) || n.ends_with(kTempSuffix) ||
        !valid_job_key(n))
      continue;
    keys.push_back(n);
    if (keys.size() >= limit) break;
  }
  closedir(d);
  return keys;
}

Fd hold_record(int jobs_fd, const std::string& key) {
  Fd fd(openat(jobs_fd, key.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  // Blocking: an exclusive holder is only another job's sweep testing it,
  // which never waits while it holds it.
  if (fd.get() >= 0 && flock(fd.get(), LOCK_SH) != 0) return Fd(-1);
  return fd;
}

bool record_held(int jobs_fd, const std::string& key) {
  Fd fd(openat(jobs_fd, key.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  return fd.get() >= 0 && flock(fd.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
}

void remove_record(int jobs_fd, const std::string& key) {
  unlinkat(jobs_fd, cgroup_record_name(key).c_str(), 0);
  unlinkat(jobs_fd, key.c_str(), 0);
}

std::vector<std::string> read_cgroup_record(int jobs_fd, const std::string& key) {
  bool found;
  std::string text = read_small(jobs_fd, cgroup_record_name(key), found);
  std::vector<std::string> dirs;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.starts_with("/sys/fs/cgroup/") && line.find("/../") == std::string::npos)
      dirs.push_back(line);
  return dirs;
}

}  // namespace monarch::spank
