// Path resolution as the kernel does it, for the interposition library. Pure
// logic over a job map: no system calls, so it is tested without LD_PRELOAD.
//
// The kernel follows a symbolic link before it applies "..", refuses a
// regular file used as a directory, and never looks at the text of a path
// past a component that does not exist. Monarch says a path names a dataset
// file only when the kernel would reach that very file: every directory the
// path goes through is one the index recorded (real directories, no links),
// and ".." is applied only to such directories, or to the physical current
// directory (getcwd's answer). Anything else under the dataset is kUnsure:
// the call passes through and the kernel decides.
#pragma once

#include <cstdint>
#include <string_view>

#include "jobmap.h"
#include "views.h"

namespace monarch {

enum class Where : uint8_t {
  kOutside,  // not in the dataset
  kFile,     // the indexed dataset file `id`
  kDir,      // an indexed dataset directory `id`, or the root (kRoot)
  kUnsure,   // may be in the dataset, but Monarch cannot be sure which file
};

struct Resolved {
  Where where = Where::kOutside;
  uint32_t id = 0;
  uint8_t view = 0;  // inside: the view the path entered the dataset through
};
inline constexpr uint32_t kRoot = 0xffffffff;  // Resolved::id of the dataset root

// Resolves `path` in a namespace where the dataset root is reached by the
// paths `views`. `cwd` is the physical directory a relative path starts
// from (getcwd's answer, or a directory descriptor's /proc path); empty when
// unknown, which makes a relative path kOutside.
Resolved resolve(const JobMap& m, const Views& views, std::string_view path, std::string_view cwd);

}  // namespace monarch
