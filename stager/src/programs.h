// Where Monarch's programs find each other's files: the build tree first
// (beside or near the running program), then the install.
#pragma once

#include <initializer_list>
#include <string>

namespace monarch {

// The running program's directory; empty when /proc cannot say (never a
// relative path: the working directory may be anybody's).
std::string exe_dir();
// The first of `candidates` that exists, its symbolic links resolved; the
// first candidate when none does.
std::string find_file(std::initializer_list<std::string> candidates);

}  // namespace monarch
