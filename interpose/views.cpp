#include "views.h"

#include <fcntl.h>
#include <limits.h>

#include <cstring>

#include "decimal.h"
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
  const char* end;
  m.major = unsigned(parse_decimal(dev, &end, UINT_MAX));
  if (end == dev || end != colon) return false;
  m.minor = unsigned(parse_decimal(colon + 1, &end, UINT_MAX));
  if (end == colon + 1 || *end) return false;
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

size_t root_along(std::string_view cwd, std::string_view path, std::string_view rel, char* out,
                  size_t cap) {
  if (path.empty() || rel.empty() || rel[0] == '/' || rel.back() == '/') return 0;
  bool relative = path[0] != '/';
  if (relative && (cwd.empty() || cwd[0] != '/')) return 0;
  // The absolute path, on the stack: opens run in signal handlers.
  char abs[2 * PATH_MAX + 2];
  size_t len = 0;
  for (std::string_view part : {relative ? cwd : std::string_view(), std::string_view("/"), path}) {
    if (part.empty()) continue;  // an empty view's data() may be null, which memcpy may not take
    if (len + part.size() >= sizeof abs) return 0;
    std::memcpy(abs + len, part.data(), part.size());
    len += part.size();
  }
  // The next component before `end`, skipping empty ones and "."; sets `end`
  // to where it starts. Empty at the path's start.
  auto previous = [&](size_t& end) {
    for (;;) {
      while (end > 0 && abs[end - 1] == '/') --end;
      size_t start = end;
      while (start > 0 && abs[start - 1] != '/') --start;
      std::string_view c(abs + start, end - start);
      end = start;
      if (c != ".") return c;
    }
  };
  // rel's components, last first, are the path's last ones.
  size_t end = len;
  for (size_t r = rel.size(); r > 0;) {
    size_t start = rel.rfind('/', r - 1);
    start = start == std::string_view::npos ? 0 : start + 1;
    if (start == r || previous(end) != std::string_view(rel.data() + start, r - start)) return 0;
    r = start == 0 ? 0 : start - 1;
  }
  // What is before them, lexically normal; ".." makes it unknowable.
  size_t n = 0;
  for (size_t at = 0; at < end;) {
    while (at < end && abs[at] == '/') ++at;
    size_t stop = at;
    while (stop < end && abs[stop] != '/') ++stop;
    std::string_view c(abs + at, stop - at);
    at = stop;
    if (c.empty() || c == ".") continue;
    if (c == ".." || n + 1 + c.size() >= cap) return 0;
    out[n++] = '/';
    std::memcpy(out + n, c.data(), c.size());
    n += c.size();
  }
  if (n == 0) return 0;
  out[n] = 0;
  return n;
}

}  // namespace monarch
