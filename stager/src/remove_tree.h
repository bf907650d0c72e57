// Deleting a job's node-local directories, safely even as root: never follows
// a symbolic link, never enters another mount (a different st_dev or mount id),
// never leaves the tree it was given.
#pragma once

#include <cstdint>
#include <string>

namespace monarch {

struct RemoveResult {
  uint64_t removed = 0;  // entries deleted
  uint64_t mounts = 0;   // mount points found and left alone
  uint64_t errors = 0;   // entries that could not be deleted
  int first_errno = 0;
  std::string first_path;  // where the first error happened
};

// Removes `name` (a single component) inside the directory open as `parent_fd`,
// with everything below it. A symbolic link named `name` is removed itself.
RemoveResult remove_tree_at(int parent_fd, const std::string& name);

// Same, for an absolute path whose parent directory is trusted (a tier).
RemoveResult remove_tree(const std::string& path);

}  // namespace monarch
