// The pointers to the real functions of wrappers.def, resolved once with
// dlsym(RTLD_NEXT, ...) so that Monarch stacks with other preloaded tools.
#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <unistd.h>
#include <utime.h>

#include <cstring>

#include "handlers.h"

// The first version of glibc's symbols on this architecture, which every
// glibc since has. dlsym is bound to it: glibc 2.34 gave it a new default
// version (GLIBC_2.34) that an older glibc lacks, and the loader refuses a
// library that asks for a version its glibc lacks.
#if defined(__x86_64__)
#define MONARCH_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define MONARCH_GLIBC_BASE "GLIBC_2.17"
#else
#error "the first glibc symbol version of this architecture is not known here"
#endif
__asm__(".symver dlsym,dlsym@" MONARCH_GLIBC_BASE);

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
void (*testcancel)() = nullptr;

namespace {
// The real functions an older C library lacks, which Monarch itself calls
// (a file's identity, the attributes of a path): glibc before 2.33 exports
// no stat, fstat, lstat, fstatat (nor their *64 names; its headers made them
// inline calls of the __xstat family, with a version argument), and glibc
// before 2.28 no statx. Here they are the __xstat family's (still the real
// functions of the process, after other preloaded tools), else the system
// call: never a null pointer.
#if defined(__x86_64__)
constexpr int kStatVer = 1;  // _STAT_VER_LINUX: the kernel's struct stat, which is glibc's
#else
constexpr int kStatVer = 0;  // _STAT_VER_KERNEL
#endif
int fstatat_fallback(int dirfd, const char* path, struct stat* st, int flags) {
  if (__fxstatat) return __fxstatat(kStatVer, dirfd, path, st, flags);
  return int(syscall(SYS_newfstatat, dirfd, path, st, flags));
}
int stat_fallback(const char* path, struct stat* st) {
  if (__xstat) return __xstat(kStatVer, path, st);
  return fstatat_fallback(AT_FDCWD, path, st, 0);
}
int lstat_fallback(const char* path, struct stat* st) {
  if (__lxstat) return __lxstat(kStatVer, path, st);
  return fstatat_fallback(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}
int fstat_fallback(int fd, struct stat* st) {
  if (__fxstat) return __fxstat(kStatVer, fd, st);
  return int(syscall(SYS_fstat, fd, st));
}
int statx_fallback(int dirfd, const char* path, int flags, unsigned mask, struct statx* stx) {
  return int(syscall(SYS_statx, dirfd, path, flags, mask, stx));
}
struct Fallback {
  const char* name;
  void* fn;
};
// struct stat64 is struct stat (handlers.h): the *64 names share them.
const Fallback kFallbacks[] = {
    {"stat", reinterpret_cast<void*>(stat_fallback)},
    {"stat64", reinterpret_cast<void*>(stat_fallback)},
    {"lstat", reinterpret_cast<void*>(lstat_fallback)},
    {"lstat64", reinterpret_cast<void*>(lstat_fallback)},
    {"fstat", reinterpret_cast<void*>(fstat_fallback)},
    {"fstat64", reinterpret_cast<void*>(fstat_fallback)},
    {"fstatat", reinterpret_cast<void*>(fstatat_fallback)},
    {"fstatat64", reinterpret_cast<void*>(fstatat_fallback)},
    {"statx", reinterpret_cast<void*>(statx_fallback)},
};

// dlvsym is glibc's (musl has none): looked up, not linked.
using Dlvsym = void* (*)(void*, const char*, const char*);

// The function `name` after this library, or its fallback, or null. glibc
// >= 2.33 keeps the __xstat family only as compat symbols, which an
// unversioned dlsym does not return.
void* find(const char* name, Dlvsym vsym) {
  void* p = dlsym(RTLD_NEXT, name);
  if (!p && vsym) p = vsym(RTLD_NEXT, name, MONARCH_GLIBC_BASE);
  for (const Fallback& f : kFallbacks)
    if (!p && std::strcmp(f.name, name) == 0) p = f.fn;
  return p;
}
}  // namespace

void resolve() {
  Dlvsym vsym = reinterpret_cast<Dlvsym>(dlsym(RTLD_DEFAULT, "dlvsym"));
  testcancel = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "pthread_testcancel"));
#define MONARCH_RESOLVE(name) name = reinterpret_cast<decltype(name)>(find(#name, vsym));
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

bool libc_is_glibc() {
  return dlsym(RTLD_DEFAULT, "gnu_get_libc_version") != nullptr;
}
}  // namespace monarch::real
