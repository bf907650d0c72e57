#include "record.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
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

// Names in the order they are written; every one is required, once, in
// this order.
constexpr const char* kFields[] = {"version", "key",   "space", "uid",      "gid",
                                   "groups",  "umask", "boot",  "restarts", "mount_id"};
constexpr size_t kMaxGroups = 65536;  // NGROUPS_MAX

// Decimal digits only (no sign, space or leading zero), at most `max`.
bool parse_decimal(std::string_view v, uint64_t max, uint64_t& out) {
  if (v.empty() || v.size() > 20 || (v.size() > 1 && v[0] == '0')) return false;
  uint64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return false;
    uint64_t d = uint64_t(c - '0');
    if (n > (max - d) / 10) return false;
    n = n * 10 + d;
  }
  out = n;
  return true;
}

bool parse_id(std::string_view v, uint32_t& out) {
  uint64_t n;
  // (uid_t)-1 names nobody: chown and setresuid read it as "leave alone".
  if (!parse_decimal(v, 0xfffffffe, n)) return false;
  out = uint32_t(n);
  return true;
}

bool parse_groups(std::string_view v, std::vector<gid_t>& out) {
  for (size_t at = 0; at <= v.size();) {
    size_t comma = std::min(v.find(',', at), v.size());
    uint32_t g;
    if (!parse_id(v.substr(at, comma - at), g) || out.size() >= kMaxGroups) return false;
    out.push_back(g);
    at = comma + 1;
  }
  return true;
}

// The kernel's boot id: a UUID.
bool valid_boot(std::string_view v) {
  if (v.size() != 36) return false;
  for (size_t i = 0; i < v.size(); ++i) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    char c = v[i];
    if (dash ? c != '-' : !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// One name=value line into `r`; false when the line is not as written.
bool parse_field(std::string_view name, std::string_view value, const std::string& key,
                 JobRecord& r) {
  uint64_t n = 0;
  uint32_t id = 0;
  if (name == "version") return value == "2";
  if (name == "key") return value == key;
  if (name == "space") {
    if (value != "image" && value != "directory") return false;
    r.space = value == "image" ? JobSpace::kImage : JobSpace::kDirectory;
    return true;
  }
  if (name == "uid") return parse_id(value, id) && id != 0 && (r.uid = id, true);
  if (name == "gid") return parse_id(value, id) && (r.gid = id, true);
  if (name == "groups") return parse_groups(value, r.groups);
  if (name == "umask") {
    if (value.size() != 4 || value[0] != '0') return false;
    for (char c : value.substr(1))
      if (c < '0' || c > '7') return false;
    r.umask = mode_t(((value[1] - '0') << 6) | ((value[2] - '0') << 3) | (value[3] - '0'));
    return true;
  }
  if (name == "boot") return valid_boot(value) && (r.boot = value, true);
  if (name == "restarts") return parse_decimal(value, UINT32_MAX, n) && (r.restarts = n, true);
  if (name == "mount_id") return parse_decimal(value, UINT64_MAX, n) && (r.mount_id = n, true);
  return false;
}

}  // namespace

std::string cgroup_record_name(const std::string& key) {
  return key + kCgroupSuffix;
}

std::string record_text(const JobRecord& r) {
  std::string groups;
  for (gid_t g : r.groups) groups += (groups.empty() ? "" : ",") + std::to_string(g);
  char umask[8];
  std::snprintf(umask, sizeof umask, "%04o", unsigned(r.umask & 0777));
  const std::string values[] = {"2",
                                r.key,
                                r.space == JobSpace::kImage ? "image" : "directory",
                                std::to_string(r.uid),
                                std::to_string(r.gid),
                                groups,
                                umask,
                                r.boot,
                                std::to_string(r.restarts),
                                std::to_string(r.mount_id)};
  std::string text =
      "# What the Monarch Slurm plugin made for this job on this tier (root's; do not edit)\n";
  for (size_t i = 0; i < std::size(kFields); ++i) text += kFields[i] + ("=" + values[i]) + "\n";
  return text;
}

JobRecord parse_record(const std::string& key, std::string_view text) {
  JobRecord r{.key = key};
  size_t next = 0;  // kFields[next] is the name the next line must have
  bool ok = text.size() < kMaxRecordBytes, space_ok = false;
  for (size_t at = 0; ok && at < text.size();) {
    size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos) ok = false;  // every line ends: else it was cut
    std::string_view line = text.substr(at, nl - at);
    at = nl + 1;
    for (char c : line) ok &= (unsigned char)c >= 0x20 && c != 0x7f;
    if (!ok || line.starts_with('#')) continue;
    size_t eq = line.find('=');
    std::string_view name = line.substr(0, eq);
    // The next name in the order they are written, and only that one.
    ok = eq != std::string_view::npos && next < std::size(kFields) && name == kFields[next] &&
         parse_field(name, line.substr(eq + 1), key, r);
    if (ok && name == "space") space_ok = true;
    next += ok;
  }
  ok &= next == std::size(kFields);
  if (ok && std::find(r.groups.begin(), r.groups.end(), r.gid) == r.groups.end()) ok = false;
  if (ok) return r;
  // Damaged: what names the space where its line was well formed; nothing else.
  return JobRecord{.key = key, .space = space_ok ? r.space : JobSpace::kDirectory, .damaged = true};
}

void write_record(int jobs_fd, const JobRecord& r) {
  std::string text = record_text(r), tmp = r.key + kTempSuffix;
  // Never a record that would read back damaged (a job key or boot id out of
  // shape): its next step or its end would take the space for another run's.
  if (parse_record(r.key, text).damaged)
    throw std::runtime_error("cannot write the record of " + r.key + ": a value out of shape");
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
  return parse_record(key, text);
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
