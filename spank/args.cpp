#include "args.h"

namespace monarch::spank {

void parse_plugstack_args(const std::vector<std::string_view>& words, Args& args,
                          const std::function<void(const std::string&)>& error) {
  for (std::string_view word : words) {
    size_t eq = word.find('=');
    std::string key(word.substr(0, eq));
    std::string value(eq == std::string_view::npos ? "" : word.substr(eq + 1));
    if (key == "config") {
      if (value.empty() || value[0] != '/') {
        error("plugstack argument '" + std::string(word) +
              "': config= needs an absolute path; Monarch is off");
        args.enabled = false;
      } else {
        args.config = value;
      }
    } else if (key == "enabled") {
      if (value == "yes" || value == "true" || value == "on" || value == "1") {
        args.enabled = true;
      } else if (value == "no" || value == "false" || value == "off" || value == "0") {
        args.enabled = false;
      } else {
        error("plugstack argument '" + std::string(word) +
              "': accepted enabled=yes or enabled=no; Monarch is off");
        args.enabled = false;
      }
    } else {
      error("unknown plugstack argument '" + key +
            "' ignored; accepted: config=PATH, enabled=yes|no");
    }
  }
}

}  // namespace monarch::spank
