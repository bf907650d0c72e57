#include "image.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "mounts.h"

namespace monarch::spank {
namespace {

constexpr const char* kMke2fs = "/sbin/mke2fs";
constexpr unsigned kMke2fsTimeout = 120;  // seconds; a few tenths for a terabyte here
constexpr uint64_t kMinImage = 256 << 10;
constexpr uint64_t kBlock = 4096;
constexpr int kLoopAttempts = 16;  // another process may take the free loop device first
// <linux/ext4.h> is not installed: EXT4_IOC_SHUTDOWN and its flag.
constexpr unsigned long kExt4Shutdown = _IOR('X', 125, uint32_t);
constexpr uint32_t kShutdownNoLogFlush = 2;

std::string errno_text() {
  return std::strerror(errno);
}

// mke2fs, as root, killed after a while: an ext4 file system without a
// journal (a cache needs none: after a crash the image is thrown away),
// one inode per 8 KiB, nothing reserved for root, inode tables left for
// the kernel to initialize lazily.
void make_file_system(const std::string& path, const std::string& label) {
  std::vector<std::string> argv{kMke2fs,
                                "-q",
                                "-F",
                                "-t",
                                "ext4",
                                "-b",
                                "4096",
                                "-i",
                                "8192",
                                "-m",
                                "0",
                                "-O",
                                "^has_journal",
                                "-E",
                                "lazy_itable_init=1,nodiscard",
                                "-L",
                                label.substr(0, 16),
                                path};
  std::string output;
  int rc = run_process(ChildSetup{}, argv, {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}, kMke2fsTimeout,
                       output);
  while (!output.empty() && output.back() == '\n') output.pop_back();
  if (rc != 0)
    throw TierError(std::string(kMke2fs) + " " + path + " failed (exit " + std::to_string(rc) +
                    "): " + output + " (Debian: e2fsprogs)");
}

// Attaches `image` to a free loop device, detached automatically once it is
// no longer mounted nor open. Returns the device, open.
Fd attach_loop(int image, std::string& device) {
  Fd control(open("/dev/loop-control", O_RDWR | O_CLOEXEC));
  if (!control)
    throw TierError("cannot open /dev/loop-control: " + errno_text() +
                    " (job_space = image needs loop devices; or set job_space = directory)");
  for (int attempt = 0; attempt < kLoopAttempts; ++attempt) {
    int n = ioctl(control.get(), LOOP_CTL_GET_FREE);
    if (n < 0) throw TierError("no free loop device: " + errno_text());
    device = "/dev/loop" + std::to_string(n);
    Fd dev(open(device.c_str(), O_RDWR | O_CLOEXEC));
    if (!dev) continue;
    struct loop_config config = {};
    config.fd = unsigned(image);
    config.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
    if (ioctl(dev.get(), LOOP_CONFIGURE, &config) == 0) return dev;
    if (errno != EBUSY)
      throw TierError("cannot attach the image to " + device + ": " + errno_text());
  }
  throw TierError("no free loop device after " + std::to_string(kLoopAttempts) + " attempts");
}

// A detached mount of `device` (ext4): nosuid, nodev, noatime.
Fd mount_detached(const std::string& device) {
  Fd fs(fsopen("ext4", FSOPEN_CLOEXEC));
  if (!fs) throw TierError("cannot mount ext4: " + errno_text());
  if (fsconfig(fs.get(), FSCONFIG_SET_STRING, "source", device.c_str(), 0) != 0 ||
      fsconfig(fs.get(), FSCONFIG_SET_FLAG, "noinit_itable", nullptr, 0) != 0 ||
      fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    std::string why = errno_text();
    char log[512];
    ssize_t n = read(fs.get(), log, sizeof log - 1);  // the kernel's own words, if any
    if (n > 0)
      why += " (" + std::string(log, size_t(n > 0 && log[n - 1] == '\n' ? n - 1 : n)) + ")";
    throw TierError("cannot mount " + device + ": " + why);
  }
  Fd mnt(fsmount(fs.get(), FSMOUNT_CLOEXEC,
                 MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOATIME));
  if (!mnt) throw TierError("cannot mount " + device + ": " + errno_text());
  return mnt;
}

}  // namespace

std::string image_name(const std::string& key) {
  return key + ".img";
}

void shut_down_image(int root_fd) {
  uint32_t how = kShutdownNoLogFlush;
  ioctl(root_fd, kExt4Shutdown, &how);  // best effort: a slower release otherwise
}

uint64_t image_size(const Tier& tier) {
  struct statvfs vfs;
  if (fstatvfs(tier.root.get(), &vfs) != 0)
    throw TierError("cannot statvfs " + tier.root_path + ": " + errno_text());
  uint64_t total = uint64_t(vfs.f_blocks) * vfs.f_frsize;
  uint64_t free = uint64_t(vfs.f_bavail) * vfs.f_frsize;
  const TierConfig& c = *tier.config;
  uint64_t quota = c.quota_bytes ? c.quota_bytes : uint64_t(double(total) * c.quota_percent / 100);
  uint64_t room = free > total / 100 ? free - total / 100 : 0;
  uint64_t size = std::min(quota, room) / kBlock * kBlock;
  if (size < kMinImage)
    throw TierError("tier " + c.name + ": " + human_bytes(double(room)) + " free on " +
                    tier.root_path + ", no room for the job's image (quota " +
                    human_bytes(double(quota)) + ")");
  return size;
}

uint64_t make_image(const Tier& tier, const std::string& key, const User& user) {
  uint64_t size = image_size(tier);
  std::string name = image_name(key);
  std::string path = tier.root_path + "/.monarch/images/" + name;
  Fd image(openat(tier.images.get(), name.c_str(),
                  O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!image) throw TierError("cannot create " + path + ": " + errno_text());
  if (int e = posix_fallocate(image.get(), 0, off_t(size)))
    throw TierError("tier " + tier.config->name + ": cannot reserve " + human_bytes(double(size)) +
                    " for the job's image in " + path + ": " + std::strerror(e));
  make_file_system(path, key);
  std::string device;
  Fd loop = attach_loop(image.get(), device);
  Fd mnt = mount_detached(device);
  loop.reset();  // the mount holds the device now; it goes when the mount goes

  // Ready before anyone can see it: lost+found out, the root the user's.
  Fd root(openat(mnt.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root || (unlinkat(root.get(), "lost+found", AT_REMOVEDIR) != 0 && errno != ENOENT) ||
      fchown(root.get(), user.uid, user.gid) != 0 || fchmod(root.get(), 0700) != 0)
    throw TierError("cannot prepare the job's image " + path + ": " + errno_text());
  std::string space = space_name(key);
  if (mkdirat(tier.root.get(), space.c_str(), 0700) != 0)
    throw TierError("cannot create " + tier.root_path + "/" + space + ": " + errno_text());
  if (move_mount(mnt.get(), "", tier.root.get(), space.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0)
    throw TierError("cannot mount the job's image at " + tier.root_path + "/" + space + ": " +
                    errno_text());
  return mount_id_at(tier.root.get(), space.c_str());
}

}  // namespace monarch::spank
