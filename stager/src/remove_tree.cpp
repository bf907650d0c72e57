#include "remove_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "fd.h"

namespace monarch {
namespace {

// Attributes from the kernel's cache: a FUSE daemon is never asked.
constexpr int kStatFlags = AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC;

struct Node {
  dev_t dev = 0;
  uint64_t mnt = 0;  // mount id (0 where the kernel gives none)
  uint64_t ino = 0;
  mode_t mode = 0;
};

bool stat_at(int dirfd, const char* name, int flags, Node& n) {
  struct statx sx;
  if (statx(dirfd, name, kStatFlags | flags, STATX_TYPE | STATX_INO | STATX_MNT_ID, &sx) != 0)
    return false;
  n.dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
  n.mnt = (sx.stx_mask & STATX_MNT_ID) ? sx.stx_mnt_id : 0;
  n.ino = sx.stx_ino;
  n.mode = sx.stx_mode;
  return true;
}

bool same_mount(const Node& a, const Node& b) {
  return a.dev == b.dev && a.mnt == b.mnt;
}

bool dot(const char* n) {
  return n[0] == '.' && (n[1] == 0 || (n[1] == '.' && n[2] == 0));
}

enum class Outcome { kRemoved, kGone, kLeft };

// Opens directory `name` in `dirfd` for reading, only if the inode found
// there is the directory `seen` on mount `where`: first as O_PATH (which
// asks no file system anything), checked, then reopened through ".".
Fd open_checked(int dirfd, const char* name, const Node& seen, const Node& where) {
  Fd path(openat(dirfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  Node now;
  if (!path || !stat_at(path.get(), "", AT_EMPTY_PATH, now)) return Fd();
  if (!same_mount(now, where) || now.ino != seen.ino) {
    errno = EXDEV;
    return Fd();
  }
  return Fd(openat(path.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
}

// Empties the top directory of a tree as the header describes.
class Remover {
 public:
  Remover(int top, const Node& where, RemoveResult& r) : top_(top), where_(where), r_(r) {}

  void run() {
    for (;;) {
      pass_mounts_ = pass_errors_ = 0;
      bool progress = false;
      DIR* d = fdopendir(openat(top_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!d) {
        error(".");
        break;
      }
      while (dirent* e = readdir(d)) {
        if (dot(e->d_name)) continue;
        progress |= remove_entry(e->d_name, e->d_type) == Outcome::kRemoved;
        while (!pending_.empty()) {
          std::string name = std::move(pending_);
          pending_.clear();
          progress |= remove_entry(name.c_str(), DT_DIR) == Outcome::kRemoved;
        }
      }
      closedir(d);
      // Entries added during a pass may not show in it: pass again until
      // a pass deletes nothing. What is left then stays.
      if (!progress) break;
    }
    r_.mounts = pass_mounts_;
    r_.errors = pass_errors_;
  }

 private:
  void error(const char* name) {
    if (!r_.first_errno) r_.first_errno = errno, r_.first_path = name;
    pass_errors_++;
  }

  // Deletes one entry of the top directory, emptying it first if it is a
  // directory of the tree's mount.
  Outcome remove_entry(const char* name, unsigned char type) {
    if (type != DT_DIR && type != DT_UNKNOWN) {
      if (unlinkat(top_, name, 0) == 0) return r_.removed++, Outcome::kRemoved;
      if (errno == ENOENT) return Outcome::kGone;
      if (errno != EISDIR) return error(name), Outcome::kLeft;
    }
    Node n;
    if (!stat_at(top_, name, 0, n)) {
      if (errno == ENOENT) return Outcome::kGone;
      return error(name), Outcome::kLeft;
    }
    if (!S_ISDIR(n.mode)) {
      if (unlinkat(top_, name, 0) == 0) return r_.removed++, Outcome::kRemoved;
      if (errno == ENOENT) return Outcome::kGone;
      return error(name), Outcome::kLeft;
    }
    if (!same_mount(n, where_)) return pass_mounts_++, Outcome::kLeft;
    Fd child = open_checked(top_, name, n, where_);
    if (!child) {
      if (errno == ENOENT) return Outcome::kGone;
      if (errno == EXDEV) return pass_mounts_++, Outcome::kLeft;
      return error(name), Outcome::kLeft;
    }
    empty_one_level(std::move(child));
    if (unlinkat(top_, name, AT_REMOVEDIR) == 0) return r_.removed++, Outcome::kRemoved;
    if (errno == ENOENT) return Outcome::kGone;
    // Not empty: it holds a mount point or an entry that could not go,
    // already counted, or one added meanwhile, which the next pass finds.
    if (errno != ENOTEMPTY && errno != EEXIST) error(name);
    return Outcome::kLeft;
  }

  // Deletes what `dir` holds, renaming its subdirectories up into the top.
  void empty_one_level(Fd dir) {
    DIR* d = fdopendir(dir.get());
    if (!d) return error("(directory)");
    int fd = dir.release();
    for (bool again = true; again;) {
      again = false;
      rewinddir(d);
      while (dirent* e = readdir(d)) {
        if (dot(e->d_name)) continue;
        if (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN) {
          if (unlinkat(fd, e->d_name, 0) == 0) {
            r_.removed++, again = true;
            continue;
          }
          if (errno == ENOENT) continue;
          if (errno != EISDIR) {
            error(e->d_name);
            continue;
          }
        }
        Node n;
        if (!stat_at(fd, e->d_name, 0, n)) {
          if (errno != ENOENT) error(e->d_name);
          continue;
        }
        if (!S_ISDIR(n.mode)) {
          if (unlinkat(fd, e->d_name, 0) == 0)
            r_.removed++, again = true;
          else if (errno != ENOENT)
            error(e->d_name);
          continue;
        }
        if (!same_mount(n, where_)) {
          pass_mounts_++;
          continue;
        }
        again |= rename_up(fd, e->d_name);
      }
    }
    closedir(d);
  }

  // Moves subdirectory `name` of `dir` into the top under a fresh name,
  // which becomes the pending one.
  bool rename_up(int dir, const char* name) {
    for (;;) {
      char fresh[64];
      std::snprintf(fresh, sizeof fresh, ".rm.%d.%llu", int(getpid()),
                    static_cast<unsigned long long>(serial_++));
      if (renameat2(dir, name, top_, fresh, RENAME_NOREPLACE) == 0) {
        pending_ = fresh;
        return true;
      }
      if (errno == EEXIST) continue;
      if (errno == EBUSY)  // became a mount point meanwhile
        pass_mounts_++;
      else if (errno != ENOENT)
        error(name);
      return false;
    }
  }

  int top_;
  Node where_;
  RemoveResult& r_;
  uint64_t serial_ = 0;
  uint64_t pass_mounts_ = 0, pass_errors_ = 0;
  std::string pending_;  // the directory renamed up last: emptied next
};

}  // namespace

RemoveResult remove_tree_at(int parent_fd, const std::string& name) {
  RemoveResult r;
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    errno = EINVAL;
    r.errors = 1, r.first_errno = EINVAL, r.first_path = name;
    return r;
  }
  auto fail = [&r, &name] {
    r.errors = 1, r.first_errno = errno, r.first_path = name;
    return r;
  };
  Node parent, n;
  if (!stat_at(parent_fd, "", AT_EMPTY_PATH, parent)) return fail();
  if (!stat_at(parent_fd, name.c_str(), 0, n)) return errno == ENOENT ? r : fail();
  if (!S_ISDIR(n.mode)) {
    if (unlinkat(parent_fd, name.c_str(), 0) == 0) r.removed++;
    return r.removed || errno == ENOENT ? r : fail();
  }
  if (!same_mount(n, parent)) return r.mounts = 1, r;
  Fd top = open_checked(parent_fd, name.c_str(), n, parent);
  if (!top) return errno == EXDEV ? (r.mounts = 1, r) : fail();
  Remover(top.get(), n, r).run();
  top.reset();
  if (unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) == 0)
    r.removed++;
  else if (!r.mounts && !r.errors && errno != ENOENT)
    return fail();
  return r;
}

RemoveResult remove_tree(const std::string& path) {
  size_t slash = path.find_last_of('/');
  std::string parent = slash == 0 ? "/" : path.substr(0, slash);
  Fd pfd(open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!pfd) {
    RemoveResult r;
    if (errno != ENOENT) r.errors = 1, r.first_errno = errno, r.first_path = parent;
    return r;
  }
  return remove_tree_at(pfd.get(), path.substr(slash + 1));
}

}  // namespace monarch
