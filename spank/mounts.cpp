#include "mounts.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "fd.h"

namespace monarch::spank {
namespace {

constexpr size_t kMaxMountinfo = 16 << 20;  // thousands of mounts take a few hundred KiB
// Mounts on top of each other at one point: a user makes at most mount_max
// FUSE mounts (fuse.conf, 1000 by default).
constexpr int kMaxStacked = 1024;

struct Mount {
  uint64_t id = 0, parent = 0;
  std::string point;
};

// "\040" and friends, as mountinfo escapes blanks and backslashes.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    bool octal = s[i] == '\\' && i + 3 < s.size();
    for (size_t k = 1; octal && k <= 3; ++k) octal = s[i + k] >= '0' && s[i + k] <= '7';
    if (octal) {
      out += char((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::vector<Mount> read_mountinfo() {
  std::vector<Mount> mounts;
  Fd fd(open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC));
  if (!fd) return mounts;
  std::string text;
  char buf[1 << 16];
  ssize_t n;
  while ((n = read(fd.get(), buf, sizeof buf)) > 0 && text.size() < kMaxMountinfo)
    text.append(buf, size_t(n));
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    Mount m;
    std::string devno, root, point;
    if (f >> m.id >> m.parent >> devno >> root >> point) {
      m.point = unescape(point);
      mounts.push_back(std::move(m));
    }
  }
  return mounts;
}

// Detaches whatever is mounted at the place `fd` (O_PATH) leads to.
bool detach(int fd) {
  return umount2(("/proc/self/fd/" + std::to_string(fd)).c_str(), MNT_DETACH) == 0;
}

// Detaches the mounts stacked at `leaf` in `dir_fd` (a directory of the
// tier's file system, mount `tier_mnt`), from the top, until the place
// shows the tier's own mount again. One name is looked up in `dir_fd`, and
// the lookup ends on the root of the mount on top: nothing mounted is asked.
void detach_stack(int dir_fd, const std::string& leaf, uint64_t tier_mnt, DetachResult& r,
                  uint64_t own, Fd* own_root) {
  for (int i = 0; i < kMaxStacked; ++i) {
    Fd fd(openat(dir_fd, leaf.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) return;  // gone
    uint64_t id = mount_id_at(fd.get(), "");
    if (id == 0 || id == tier_mnt) return;  // nothing mounted (a link, opened itself, is too)
    if (id == own && own_root)
      *own_root = Fd(openat(fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!detach(fd.get())) {
      if (!r.first_errno) r.first_errno = errno;
      r.failed++;
      return;
    }
    r.detached++;
  }
}

// The directory `rel` below `tier_fd`, opened only if reaching it crosses
// no mount and no link: every name on the way is looked up in the tier's
// own file system.
Fd open_on_tier(int tier_fd, const std::string& rel) {
  struct open_how how = {};
  how.flags = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
  how.resolve = RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  return Fd(int(syscall(SYS_openat2, tier_fd, rel.c_str(), &how, sizeof how)));
}

size_t depth(const std::string& path) {
  return size_t(std::count(path.begin(), path.end(), '/'));
}

}  // namespace

uint64_t mount_id_at(int dirfd, const char* name) {
  // From fdinfo, not statx: a FUSE mount without allow_other denies even
  // root any attribute (EACCES), and an O_PATH open asks it nothing.
  Fd path;
  if (*name) {
    path = Fd(openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (!path) return 0;
    dirfd = path.get();
  }
  Fd info(open(("/proc/self/fdinfo/" + std::to_string(dirfd)).c_str(), O_RDONLY | O_CLOEXEC));
  char buf[512];
  ssize_t n = info ? read(info.get(), buf, sizeof buf - 1) : -1;
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* at = std::strstr(buf, "mnt_id:");
  return at ? std::strtoull(at + 7, nullptr, 10) : 0;
}

DetachResult detach_mounts(int tier_fd, const std::string& tier_path, const std::string& name,
                           uint64_t own, Fd* own_root) {
  DetachResult r;
  uint64_t tier_mnt = mount_id_at(tier_fd, "");
  if (!tier_mnt) return r;
  std::string base = tier_path + "/" + name, prefix = base + "/";
  std::vector<Mount> below;  // made on the tier's own file system below the job's directory
  for (Mount& m : read_mountinfo()) {
    if (m.point != base && !m.point.starts_with(prefix)) continue;
    r.found += m.id != own;
    if (m.parent == tier_mnt && m.point != base) below.push_back(std::move(m));
  }
  detach_stack(tier_fd, name, tier_mnt, r, own, own_root);
  // Shallowest first: a mount covering the way to a deeper one goes first.
  std::stable_sort(below.begin(), below.end(),
                   [](const Mount& a, const Mount& b) { return depth(a.point) < depth(b.point); });
  for (const Mount& m : below) {
    std::string rel = name + "/" + m.point.substr(prefix.size());
    size_t slash = rel.rfind('/');
    Fd parent = open_on_tier(tier_fd, rel.substr(0, slash));
    if (parent) {
      detach_stack(parent.get(), rel.substr(slash + 1), tier_mnt, r, 0, nullptr);
    } else if (errno != ENOENT) {  // EXDEV: still covered by a mount that would not go
      if (!r.first_errno) r.first_errno = errno;
      r.failed++;
    }
  }
  return r;
}

}  // namespace monarch::spank
