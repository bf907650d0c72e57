#include "remove_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace monarch {
namespace {

struct Where {
  dev_t dev;
  uint64_t mnt_id;
};

bool where(int dirfd, const char* name, int flags, Where& w, mode_t* mode = nullptr) {
  struct statx sx;
  if (statx(dirfd, name, flags | AT_SYMLINK_NOFOLLOW, STATX_TYPE | STATX_MNT_ID, &sx) != 0)
    return false;
  w.dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  w.mnt_id = (sx.stx_mask & STATX_MNT_ID) ? sx.stx_mnt_id : 0;
  if (mode) *mode = sx.stx_mode;
  return true;
}

void note_error(RemoveResult& r, const std::string& path) {
  if (!r.errors++) r.first_errno = errno, r.first_path = path;
}

// Empties the directory open as `fd` (which lies at `w`), then closes it.
void empty_dir(int fd, const Where& w, const std::string& path, RemoveResult& r) {
  DIR* d = fdopendir(fd);
  if (!d) {
    note_error(r, path);
    close(fd);
    return;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  for (const std::string& n : names) {
    std::string child = path + "/" + n;
    Where cw;
    mode_t mode;
    if (!where(fd, n.c_str(), 0, cw, &mode)) {
      if (errno != ENOENT) note_error(r, child);
      continue;
    }
    if (!S_ISDIR(mode)) {  // files and symbolic links: the link itself goes
      if (unlinkat(fd, n.c_str(), 0) == 0)
        r.removed++;
      else if (errno != ENOENT)
        note_error(r, child);
      continue;
    }
    if (cw.dev != w.dev || cw.mnt_id != w.mnt_id) {
      r.mounts++;
      continue;
    }
    int cfd = openat(fd, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    Where opened;
    if (cfd < 0 || !where(cfd, "", AT_EMPTY_PATH, opened) || opened.dev != w.dev ||
        opened.mnt_id != w.mnt_id) {
      // Replaced between the check and the open, or unreadable: leave it.
      if (cfd >= 0)
        close(cfd), r.mounts++;
      else
        note_error(r, child);
      continue;
    }
    empty_dir(cfd, w, child, r);
    if (unlinkat(fd, n.c_str(), AT_REMOVEDIR) == 0)
      r.removed++;
    else if (errno != ENOENT)
      note_error(r, child);
  }
  closedir(d);
}

}  // namespace

RemoveResult remove_tree_at(int parent_fd, const std::string& name) {
  RemoveResult r;
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    errno = EINVAL;
    note_error(r, name);
    return r;
  }
  Where pw, w;
  mode_t mode;
  if (!where(parent_fd, "", AT_EMPTY_PATH, pw) || !where(parent_fd, name.c_str(), 0, w, &mode)) {
    if (errno != ENOENT) note_error(r, name);
    return r;
  }
  if (!S_ISDIR(mode)) {
    if (unlinkat(parent_fd, name.c_str(), 0) == 0)
      r.removed++;
    else
      note_error(r, name);
    return r;
  }
  if (w.dev != pw.dev || w.mnt_id != pw.mnt_id) {
    r.mounts++;
    return r;
  }
  int fd = openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  Where opened;
  if (fd < 0 || !where(fd, "", AT_EMPTY_PATH, opened) || opened.dev != w.dev ||
      opened.mnt_id != w.mnt_id) {
    if (fd >= 0) close(fd);
    note_error(r, name);
    return r;
  }
  empty_dir(fd, w, name, r);
  if (unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) == 0)
    r.removed++;
  else
    note_error(r, name);
  return r;
}

RemoveResult remove_tree(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  int pfd = open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (pfd < 0) {
    RemoveResult r;
    if (errno != ENOENT) note_error(r, parent);
    return r;
  }
  RemoveResult r = remove_tree_at(pfd, path.substr(slash + 1));
  close(pfd);
  return r;
}

}  // namespace monarch
