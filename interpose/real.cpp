// The pointers to the real functions of wrappers.def, resolved once with
// dlsym(RTLD_NEXT, ...) so that Monarch stacks with other preloaded tools.
#include <dlfcn.h>
#include <grp.h>
#include <sched.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <utime.h>

#include "handlers.h"

namespace monarch::real {
#define MONARCH_OPEN(name, params, args, dirfd) int (*name)(MONARCH_UNPAREN params, ...) = nullptr;
#define MONARCH_WRAP(ret, name, params, args, handler) ret(*name) params = nullptr;
#define MONARCH_VARIADIC(ret, name, params, args, handler) \
  ret (*name)(MONARCH_UNPAREN params, ...) = nullptr;
#define MONARCH_READ MONARCH_WRAP
#define MONARCH_ON_FD MONARCH_WRAP
#include "wrappers.def"
#undef MONARCH_OPEN
#undef MONARCH_WRAP
#undef MONARCH_VARIADIC
#undef MONARCH_READ
#undef MONARCH_ON_FD

namespace {
// glibc >= 2.33 keeps the __xstat family only as compat symbols, which an
// unversioned dlsym does not return.
void* find(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (!p) p = dlvsym(RTLD_NEXT, name, "GLIBC_2.2.5");
  return p;
}
}  // namespace

void resolve() {
#define MONARCH_RESOLVE(name) name = reinterpret_cast<decltype(name)>(find(#name));
#define MONARCH_OPEN(name, params, args, dirfd) MONARCH_RESOLVE(name)
#define MONARCH_WRAP(ret, name, params, args, handler) MONARCH_RESOLVE(name)
#define MONARCH_VARIADIC MONARCH_WRAP
#define MONARCH_READ MONARCH_WRAP
#define MONARCH_ON_FD MONARCH_WRAP
#include "wrappers.def"
#undef MONARCH_OPEN
#undef MONARCH_WRAP
#undef MONARCH_VARIADIC
#undef MONARCH_READ
#undef MONARCH_ON_FD
#undef MONARCH_RESOLVE
}
}  // namespace monarch::real
