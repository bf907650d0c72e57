// Numbers as the kernel writes them in /proc (descriptor names, pids, device
// numbers): decimal digits only, no sign or space.
#pragma once

#include <climits>

namespace monarch {

// The number at `s`; `*end` is the first character after its digits, or `s`
// itself when `s` starts with no digit or the number exceeds `max`. Not
// std::strtoul: glibc 2.38 and later compile that to __isoc23_strtoul
// (GLIBC_2.38), which older C libraries lack (check_library.py).
inline unsigned long parse_decimal(const char* s, const char** end,
                                   unsigned long max = ULONG_MAX) {
  unsigned long v = 0;
  const char* p = s;
  for (; *p >= '0' && *p <= '9'; ++p) {
    unsigned d = unsigned(*p - '0');
    if (v > (max - d) / 10) {
      *end = s;
      return 0;
    }
    v = v * 10 + d;
  }
  *end = p;
  return v;
}

}  // namespace monarch
