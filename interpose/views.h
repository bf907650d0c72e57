// Where the job's directories are in this process's namespace. A container
// mounts the dataset and the job directories where it likes (the dataset at
// /data, a tier under its own /tmp): the host's path strings in the job map
// and the environment may name nothing here, or something else. So the
// library finds each directory by what it is, its (device, inode), among the
// paths that may show it: the path as given, the map's, and where
// /proc/self/mountinfo says the directory's file system is mounted.
//
// The dataset may be reachable by several paths (views): each is a path
// prefix the library serves. A view is `physical` when no symbolic link is
// on it, so ".." from it goes to its lexical parent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "jobmap.h"

namespace monarch {

inline constexpr int kViews = 8;

struct View {
  std::string_view path;  // absolute, lexically normal, no trailing '/'
  bool physical = false;
};

struct Views {
  View v[kViews];
  int n = 0;
};

// One line of /proc/self/mountinfo.
struct Mount {
  unsigned major = 0, minor = 0;
  std::string_view root;   // the directory of its file system mounted here
  std::string_view point;  // where, relative to this process's root directory
  std::string_view type;   // "ext4", "fuse.sshfs"...
};

// Parses one mountinfo line (without its '\n'), unescaping its octal escapes
// ("\040": a space) in place. False when the line is not one.
bool parse_mount(char* line, Mount& m);

// Is `m` a mount of the file system of device `dev`?
bool on_device(const Mount& m, uint64_t dev);

// Where the directory at `host_path` may be visible through mount `m` (of
// its file system): if `host_path` ends with a path F of that file system
// that lies inside m.root, at m.point followed by the rest of F. Calls
// fn(candidate) for each such path that fits kPathMax (a few at most); the
// caller checks each by identity.
template <typename Fn>
void mount_candidates(const Mount& m, std::string_view host_path, Fn fn);

// Calls fn(const Mount&) for each line of this process's mountinfo, read
// without allocating (the first look may come from a signal handler's open),
// by one thread at a time (it holds P.loading, or is the constructor).
// Returns false when the file could not be read, or held a line longer than
// the reader's buffer (that line is skipped).
template <typename Fn>
bool for_each_mount(Fn fn);

// Where the dataset root is along the path a dataset file was opened by:
// the prefix of `path` (absolute, or relative to the absolute `cwd`) whose
// remaining components are the file's path in the index, `rel` ("a/b/x" for
// the file x of directory a/b). "/home/me/data" for "/home/me/data/a/b/x".
// Empty and "." components are skipped; ".." anywhere gives nothing (after a
// symbolic link the kernel's ".." is not the lexical one). Writes the prefix,
// lexically normal and without a trailing '/', to `out` and returns its
// length; 0 when `rel` is not the path's tail, the prefix is "/" or it does
// not fit in `cap`. The caller checks the prefix by identity.
size_t root_along(std::string_view cwd, std::string_view path, std::string_view rel, char* out,
                  size_t cap);

// ---- implementation of the templates ----

// Reads mountinfo; calls fn(m, arg) per line (for_each_mount's body).
bool read_mounts(void (*fn)(const Mount&, void*), void* arg);

template <typename Fn>
void mount_candidates(const Mount& m, std::string_view host_path, Fn fn) {
  if (m.root.empty() || m.root[0] != '/' || m.point.empty() || m.point[0] != '/') return;
  std::string_view root = m.root == "/" ? std::string_view() : m.root;
  // Each tail of host_path that starts at a '/': "/a/b/c", "/b/c", "/c".
  for (size_t at = 0; at < host_path.size(); at = host_path.find('/', at + 1)) {
    // (Not substr: its range check throws, and the library has no exceptions.)
    std::string_view tail(host_path.data() + at, host_path.size() - at);
    if (tail.size() < root.size() || tail.compare(0, root.size(), root) != 0 ||
        (tail.size() > root.size() && tail[root.size()] != '/'))
      continue;
    std::string_view rest(tail.data() + root.size(), tail.size() - root.size());
    char out[kPathMax];
    std::string_view point = m.point == "/" ? std::string_view() : m.point;
    if (point.size() + rest.size() + 1 >= sizeof out) continue;
    size_t n = 0;
    for (std::string_view part : {point, rest}) {
      for (char c : part) out[n++] = c;
    }
    if (n == 0) out[n++] = '/';
    out[n] = 0;
    fn(std::string_view(out, n));
  }
}

template <typename Fn>
bool for_each_mount(Fn fn) {
  return read_mounts([](const Mount& m, void* arg) { (*static_cast<Fn*>(arg))(m); }, &fn);
}

}  // namespace monarch
