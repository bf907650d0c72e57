#include "programs.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

namespace monarch {

std::string exe_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  std::string s = buf;
  return s.substr(0, s.rfind('/'));
}

std::string find_file(std::initializer_list<std::string> candidates) {
  char real[PATH_MAX];
  for (const std::string& c : candidates)
    if (access(c.c_str(), F_OK) == 0) return realpath(c.c_str(), real) ? real : c;
  return *candidates.begin();
}

}  // namespace monarch
