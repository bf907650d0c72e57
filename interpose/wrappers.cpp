// Expands wrappers.def into the exported wrappers and the pointers to the
// real functions. Nothing else belongs here.
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>

#include <type_traits>

#include "fdtable.h"
#include "interpose.h"

namespace monarch::real {
#define MONARCH_OPEN(name, params, args, dirfd) int (*name)(MONARCH_UNPAREN params, ...) = nullptr;
#define MONARCH_WRAP(ret, name, params, args, handler) ret(*name) params = nullptr;
#define MONARCH_READ MONARCH_WRAP
#include "wrappers.def"
#undef MONARCH_OPEN
#undef MONARCH_WRAP
#undef MONARCH_READ

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
#define MONARCH_OPEN(name, params, args, dirfd) \
  name = reinterpret_cast<decltype(name)>(find(#name));
#define MONARCH_WRAP(ret, name, params, args, handler) \
  name = reinterpret_cast<decltype(name)>(find(#name));
#define MONARCH_READ MONARCH_WRAP
#include "wrappers.def"
#undef MONARCH_OPEN
#undef MONARCH_WRAP
#undef MONARCH_READ
}
}  // namespace monarch::real

#define MONARCH_EXPORT __attribute__((visibility("default")))

using monarch::Pass;

namespace {
// The wrapper's body: resolve, skip Monarch when re-entered, never let an
// exception out. A function with no real counterpart fails with ENOSYS.
template <typename R, typename Fn, typename Handler>
R serve(bool have_real, Fn& fn, Handler handler) {
  if (!have_real) {
    errno = ENOSYS;
    if constexpr (std::is_pointer_v<R>)
      return nullptr;
    else
      return R(-1);
  }
  if (!monarch::enter()) return fn();
  struct Leave {
    ~Leave() { monarch::leave(); }
  } leave;
  try {
    return handler();
  } catch (...) {
    return fn();
  }
}
}  // namespace

#define MONARCH_OPEN(name, params, args, dirfd)                                          \
  extern "C" MONARCH_EXPORT int name(MONARCH_UNPAREN params, ...) {                      \
    mode_t mode = 0;                                                                     \
    if (flags & (O_CREAT | O_TMPFILE)) {                                                 \
      va_list ap;                                                                        \
      va_start(ap, flags);                                                               \
      mode = va_arg(ap, mode_t);                                                         \
      va_end(ap);                                                                        \
    }                                                                                    \
    if (!monarch::real::name) monarch::real::resolve();                                  \
    if (monarch::real::name && monarch::outside(dirfd, path))                            \
      return monarch::real::name(MONARCH_UNPAREN args, mode);                            \
    auto fn = [&]() -> int { return monarch::real::name(MONARCH_UNPAREN args, mode); };  \
    Pass<int> pass(fn);                                                                  \
    return serve<int>(monarch::real::name != nullptr, fn,                                \
                      [&] { return monarch::on_open(dirfd, path, flags, mode, pass); }); \
  }
#define MONARCH_WRAP(ret, name, params, args, handler)                                       \
  extern "C" MONARCH_EXPORT ret name params {                                                \
    if (!monarch::real::name) monarch::real::resolve();                                      \
    auto fn = [&]() -> ret { return monarch::real::name args; };                             \
    Pass<ret> pass(fn);                                                                      \
    using namespace monarch;                                                                 \
    return serve<ret>(monarch::real::name != nullptr, fn, [&]() -> ret { return handler; }); \
  }
#define MONARCH_READ(ret, name, params, args, handler)                       \
  extern "C" MONARCH_EXPORT ret name params {                                \
    if (__builtin_expect(!monarch::real::name, 0)) monarch::real::resolve(); \
    monarch::FdEntry* e = monarch::tracked(fd);                              \
    if (!e || !monarch::real::name) return monarch::real::name args;         \
    if (e->kind.load(std::memory_order_relaxed) == monarch::kLocal &&        \
        (monarch::t_slot.sample++ & 63) != 0) {                              \
      ret r = monarch::real::name args;                                      \
      monarch::count_local(e, r);                                            \
      return r;                                                              \
    }                                                                        \
    auto fn = [&]() -> ret { return monarch::real::name args; };             \
    Pass<ret> pass(fn);                                                      \
    using namespace monarch;                                                 \
    return serve<ret>(true, fn, [&]() -> ret { return handler; });           \
  }
#include "wrappers.def"
#undef MONARCH_OPEN
#undef MONARCH_WRAP
#undef MONARCH_READ
