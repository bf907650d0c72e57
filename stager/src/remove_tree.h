// Deleting a directory tree, safely even as root and at a cost bounded
// whatever the tree's depth, width and names:
//  - it never follows a symbolic link (a link is removed itself), never
//    enters another mount (device and mount id are checked before a
//    directory is opened), and never leaves the tree it was given;
//  - it never waits on a FUSE daemon: attributes come from the kernel's
//    cache (AT_STATX_DONT_SYNC) and a directory is opened only after the
//    inode behind an O_PATH descriptor was found on the tree's own mount;
//  - memory and descriptors are constant (two directory streams, a few
//    descriptors, one pending name): there is no recursion. Emptying a
//    directory deletes its files and renames its subdirectories up into the
//    tree's top directory under fresh names (".rm.PID.N"), where they are
//    emptied in turn; the directory renamed last is emptied next, so a chain
//    of any depth goes in one pass.
#pragma once

#include <cstdint>
#include <string>

namespace monarch {

struct RemoveResult {
  uint64_t removed = 0;  // entries deleted
  uint64_t mounts = 0;   // mount points found (and left alone) in the end
  uint64_t errors = 0;   // entries that could not be deleted, in the end
  int first_errno = 0;
  std::string first_path;  // the name (inside the tree) of the first error
};

// Removes `name` (a single component) inside the directory open as
// `parent_fd`, with everything below it. A symbolic link, or anything that
// is not a directory, named `name` is removed itself. Nothing there: no error.
RemoveResult remove_tree_at(int parent_fd, const std::string& name);

// Same, for an absolute path whose parent directory is trusted (a tier).
RemoveResult remove_tree(const std::string& path);

}  // namespace monarch
