// Expands wrappers.def into the exported wrappers. Nothing else belongs here:
// the logic is in the handlers (handlers.h).
#include <errno.h>
#include <grp.h>
#include <sched.h>
#include <spawn.h>
#include <stdarg.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <utime.h>

#include <type_traits>

#include "fdtable.h"
#include "handlers.h"
#include "mappings.h"
#include "process.h"

#define MONARCH_EXPORT __attribute__((visibility("default")))

using monarch::Pass;
using monarch::PassFd;

namespace {
// The wrapper's body: skip Monarch when re-entered. A function with no real
// counterpart fails with ENOSYS. Built without exceptions (CMakeLists.txt):
// the handlers throw none, and a thread's cancellation unwinds through here
// without running Monarch's destructors, so no handler holds a lock across a
// cancellation point (read.cpp's Position turns cancellation off meanwhile).
template <typename R, typename Fn, typename Handler>
R serve(bool have_real, Fn& fn, Handler handler) {
  if (!have_real) {
    errno = ENOSYS;
    if constexpr (std::is_void_v<R>)
      return;
    else if constexpr (std::is_pointer_v<R>)
      return nullptr;
    else
      return R(-1);
  }
  if (!monarch::enter(reinterpret_cast<uintptr_t>(__builtin_frame_address(0)))) return fn();
  struct Leave {
    ~Leave() { monarch::leave(); }
  } leave;
  return handler();
}
}  // namespace

// Every wrapper first looks, once, whether a dataset file's mapping has a
// copy to move to, or a moved one must go back (maps_check, mappings.h: one
// load when the process has no such mapping): an epoch of numpy.memmap
// slices or LMDB gets makes no system call, but what a training loop makes
// between them (a DataLoader's reads of its pipes, opens, stats, closes)
// comes here. The fast paths look before they choose; the served calls
// they choose (`name##_served`) do not look again.

// glibc's own test (__OPEN_NEEDS_MODE): O_TMPFILE contains O_DIRECTORY's bit.
#define MONARCH_NEEDS_MODE(flags) (((flags)&O_CREAT) || ((flags)&O_TMPFILE) == O_TMPFILE)
// An open that may change a file: whatever its path, it goes to the handler,
// which finds a dataset file by its identity (another name, a link).
#define MONARCH_WRITES(flags) (((flags)&O_ACCMODE) != O_RDONLY || ((flags)&O_TRUNC))

// An open for reading of a path outside the dataset is the real call; the
// others (a path that may be inside, an open that may write, a real function
// missing, an open outside while Monarch may learn a path to the dataset
// from it: process.h learning()) take the served call's frame, out of line
// (`name##_served`).
#define MONARCH_OPEN(name, params, args, dirfd)                                          \
  namespace {                                                                            \
  __attribute__((noinline)) int name##_served(MONARCH_UNPAREN params, mode_t mode) {     \
    auto fn = [&]() -> int { return monarch::real::name(MONARCH_UNPAREN args, mode); };  \
    Pass<int> pass(fn);                                                                  \
    return serve<int>(monarch::real::name != nullptr, fn,                                \
                      [&] { return monarch::on_open(dirfd, path, flags, mode, pass); }); \
  }                                                                                      \
  }                                                                                      \
  extern "C" MONARCH_EXPORT int name(MONARCH_UNPAREN params, ...) {                      \
    mode_t mode = 0;                                                                     \
    if (MONARCH_NEEDS_MODE(flags)) {                                                     \
      va_list ap;                                                                        \
      va_start(ap, flags);                                                               \
      mode = va_arg(ap, mode_t);                                                         \
      va_end(ap);                                                                        \
    }                                                                                    \
    if (__builtin_expect(!monarch::real::name, 0)) monarch::real::resolve();             \
    monarch::maps_check();                                                               \
    if (monarch::real::name && !MONARCH_WRITES(flags) && monarch::outside(dirfd, path))  \
      if (!monarch::learning()) return monarch::real::name(MONARCH_UNPAREN args, mode);  \
    return name##_served(MONARCH_UNPAREN args, mode);                                    \
  }
#define MONARCH_WRAP(ret, name, params, args, handler)                                       \
  extern "C" MONARCH_EXPORT ret name params {                                                \
    if (!monarch::real::name) monarch::real::resolve();                                      \
    monarch::maps_check();                                                                   \
    auto fn = [&]() -> ret { return monarch::real::name args; };                             \
    auto with_fd = [&](int fd) -> ret { return monarch::real::name args; };                  \
    Pass<ret> pass(fn);                                                                      \
    PassFd<ret> on_fd(with_fd);                                                              \
    (void)on_fd;                                                                             \
    using namespace monarch;                                                                 \
    return serve<ret>(monarch::real::name != nullptr, fn, [&]() -> ret { return handler; }); \
  }
#define MONARCH_VARIADIC(ret, name, params, args, handler)                                   \
  extern "C" MONARCH_EXPORT ret name(MONARCH_UNPAREN params, ...) {                          \
    va_list ap;                                                                              \
    va_start(ap, cmd);                                                                       \
    void* arg = va_arg(ap, void*);                                                           \
    va_end(ap);                                                                              \
    if (!monarch::real::name) monarch::real::resolve();                                      \
    monarch::maps_check();                                                                   \
    auto fn = [&]() -> ret { return monarch::real::name args; };                             \
    Pass<ret> pass(fn);                                                                      \
    using namespace monarch;                                                                 \
    return serve<ret>(monarch::real::name != nullptr, fn, [&]() -> ret { return handler; }); \
  }
// The served call of a descriptor wrapper, out of line: the fast paths
// below make the real call without its frame (the reentrancy guard, the
// callable that makes the real call, the arguments kept in memory for it).
#define MONARCH_SERVED(ret, name, params, args, handler)           \
  namespace {                                                      \
  __attribute__((noinline)) ret name##_served params {             \
    auto fn = [&]() -> ret { return monarch::real::name args; };   \
    Pass<ret> pass(fn);                                            \
    using namespace monarch;                                       \
    return serve<ret>(true, fn, [&]() -> ret { return handler; }); \
  }                                                                \
  }
// The real function resolved, or the call fails with ENOSYS.
#define MONARCH_REAL_OR_ENOSYS(name)                     \
  if (__builtin_expect(!monarch::real::name, 0)) {       \
    monarch::real::resolve();                            \
    if (!monarch::real::name) return errno = ENOSYS, -1; \
  }
// The inline read path: descriptors Monarch did not open, and local copies
// of files nobody changed (63 of 64 reads; the 64th is timed by the handler).
#define MONARCH_READ(ret, name, params, args, handler)                     \
  MONARCH_SERVED(ret, name, params, args, handler)                         \
  extern "C" MONARCH_EXPORT ret name params {                              \
    MONARCH_REAL_OR_ENOSYS(name)                                           \
    monarch::maps_check();                                                 \
    monarch::FdEntry* e = monarch::tracked(fd);                            \
    if (!e) return monarch::real::name args;                               \
    if (monarch::native_read(e) && (monarch::t_slot.sample++ & 63) != 0) { \
      ret r = monarch::real::name args;                                    \
      monarch::count_local(e, r);                                          \
      return r;                                                            \
    }                                                                      \
    return name##_served args;                                             \
  }
// Descriptors Monarch did not open: the real call, as the handler would make it.
#define MONARCH_ON_FD(ret, name, params, args, handler)                          \
  MONARCH_SERVED(ret, name, params, args, handler)                               \
  extern "C" MONARCH_EXPORT ret name params {                                    \
    MONARCH_REAL_OR_ENOSYS(name)                                                 \
    monarch::maps_check();                                                       \
    return monarch::tracked(fd) ? name##_served args : monarch::real::name args; \
  }
#include "wrappers.def"
#undef MONARCH_OPEN
#undef MONARCH_WRAP
#undef MONARCH_VARIADIC
#undef MONARCH_READ
#undef MONARCH_ON_FD
#undef MONARCH_SERVED
#undef MONARCH_REAL_OR_ENOSYS
