// Text that came from a user (a path, a name, a file's contents), as it may
// be shown in a report or written to a log: a control character (a newline
// that would start a line of its own, an escape sequence) as \xNN. One
// definition for the stager's reports and the Slurm plugin's log.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace monarch {

inline bool is_control(char c) {
  return (unsigned char)c < 0x20 || c == 0x7f;
}

inline std::string shown(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (!is_control(c)) {
      out += c;
      continue;
    }
    char esc[8];
    std::snprintf(esc, sizeof esc, "\\x%02x", unsigned((unsigned char)c));
    out += esc;
  }
  return out;
}

}  // namespace monarch
