// The plugin's arguments from plugstack.conf ("required spank_monarch.so
// key=value ..."): their parser, apart from the plugin's entry points so that
// it builds without Slurm (tests/fuzz).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace monarch::spank {

struct Args {
  std::string config = MONARCH_SPANK_CONFIG;  // the node configuration
  bool enabled = true;                        // enabled=no: the options have no effect
};

// Applies the words to `args`, in order, onto what it holds (the defaults
// first). An unknown argument is reported through `error` by name and
// ignored; a bad value is reported and turns the plugin off (enabled =
// false). Accepted: config=PATH (absolute), enabled=yes|no (also
// true|false, on|off, 1|0).
void parse_plugstack_args(const std::vector<std::string_view>& words, Args& args,
                          const std::function<void(const std::string&)>& error);

}  // namespace monarch::spank
