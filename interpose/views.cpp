#include "views.h"

#include <fcntl.h>

#include <cstring>

#include "handlers.h"

namespace monarch {

// The kernel's encoding of a dev_t (glibc's gnu_dev_major/minor, written
// out: the library needs nothing above its glibc floor).
bool on_device(const Mount& m, uint64_t dev) {
  return m.major == unsigned(((dev >> 8) & 0xfff) | ((dev >> 32) & ~uint64_t(0xfff))) &&
         m.minor == unsigned((dev & 0xff) | ((dev >> 12) & ~uint64_t(0xff)));
}

namespace {

// The next space-separated field of `p` (advanced past it); empty at the end.
char* field(char*& p) {
  while (*p == ' ') ++p;
  char* start = p;
  while (*p && *p != ' ') ++p;
  if (*p) *p++ = 0;
  return start;
}

// Unescapes "\ooo" in place; returns the length.
size_t unescape(char* s) {
  size_t n = 0;
  for (const char* p = s; *p; ++p) {
    if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' && p[3] >= '0' &&
        p[3] <= '7') {
      s[n++] = char((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
      p += 3;
    } else {
      s[n++] = *p;
    }
  }
  s[n] = 0;
  return n;
}

}  // namespace

bool parse_mount(char* line, Mount& m) {
  // id parent major:minor root point options [optional fields...] - type source super
  char* p = line;
  field(p);
  field(p);
  char* dev = field(p);
  char* root = field(p);
  char* point = field(p);
  field(p);
  char* f;
  while (*(f = field(p)) && std::strcmp(f, "-") != 0) {
  }
  char* type = field(p);
  char* colon = std::strchr(dev, ':');
  if (!*type || !colon || !*root || !*point) return false;
  char* end;
  m.major = unsigned(std::strtoul(dev, &end, 10));
  if (end != colon) return false;
  m.minor = unsigned(std::strtoul(colon + 1, &end, 10));
  if (*end) return false;
  m.root = std::string_view(root, unescape(root));
  m.point = std::string_view(point, unescape(point));
  m.type = std::string_view(type, unescape(type));
  return true;
}

bool read_mounts(void (*fn)(const Mount&, void*), void* arg) {
  static char buf[16384];  // one caller at a time: under P.loading, or the constructor
  int fd = real::open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t have = 0;
  bool whole = true, skipping = false;
  for (;;) {
    ssize_t n = real::read(fd, buf + have, sizeof buf - 1 - have);
    if (n < 0) whole = false;
    if (n <= 0) break;
    have += size_t(n);
    buf[have] = 0;
    char* line = buf;
    for (char* nl; (nl = std::strchr(line, '\n')); line = nl + 1) {
      *nl = 0;
      Mount m;
      if (!skipping && parse_mount(line, m)) fn(m, arg);
      skipping = false;
    }
    have = size_t(buf + have - line);
    std::memmove(buf, line, have);
    if (have >= sizeof buf - 1) have = 0, whole = false, skipping = true;  // a line too long
  }
  real::close(fd);
  return whole;
}

}  // namespace monarch
