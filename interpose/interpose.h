// Internals of libmonarch_interpose.so shared by its two files:
// wrappers.cpp (generated from wrappers.def) and interpose.cpp (the logic).
#pragma once

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

namespace monarch {

// A borrowed callable that performs the original call: what every handler
// does for calls Monarch does not serve. Lives only during the call.
template <typename R>
class Pass {
 public:
  template <typename F>
  explicit Pass(F& f) : ctx_(&f), fn_([](void* c) -> R { return (*static_cast<F*>(c))(); }) {}
  R operator()() const { return fn_(ctx_); }

 private:
  void* ctx_;
  R (*fn_)(void*);
};

// True when `path` (relative to dirfd) cannot name a dataset file: what the
// open wrappers test before anything else, so that other opens cost one
// prefix comparison. False does not mean it is one (see dataset_path).
bool outside(int dirfd, const char* path);

// Handlers: serve a call on a dataset file, or call `pass`. Never throw;
// errno on return is what the caller would see without Monarch.
int on_open(int dirfd, const char* path, int flags, mode_t mode, Pass<int> pass);
FILE* on_fopen(const char* path, const char* mode, Pass<FILE*> pass);
ssize_t on_read(int fd, void* buf, size_t n, off_t off, Pass<ssize_t> pass);
ssize_t on_readv(int fd, const struct iovec* iov, int cnt, off_t off, Pass<ssize_t> pass);
off_t on_lseek(int fd, Pass<off_t> pass);
void* on_mmap(int fd, size_t len, Pass<void*> pass);
int on_stat(int dirfd, const char* path, struct stat* st, Pass<int> pass);
int on_fstatat(int dirfd, const char* path, struct stat* st, int flags, Pass<int> pass);
int on_fstat(int fd, struct stat* st, Pass<int> pass);
int on_statx(int dirfd, const char* path, int flags, unsigned mask, struct statx* stx,
             Pass<int> pass);
int on_close(int fd, Pass<int> pass);
int on_fclose(FILE* f, Pass<int> pass);
int on_replace_fd(int newfd, Pass<int> pass);
int on_close_range(unsigned first, unsigned last, int flags, Pass<int> pass);
int on_chdir(Pass<int> pass);

// struct stat64 is struct stat on the 64-bit targets Monarch supports.
static_assert(sizeof(struct stat) == sizeof(struct stat64));
inline int on_stat(int dirfd, const char* path, struct stat64* st, Pass<int> pass) {
  return on_stat(dirfd, path, reinterpret_cast<struct stat*>(st), pass);
}
inline int on_fstatat(int dirfd, const char* path, struct stat64* st, int flags, Pass<int> pass) {
  return on_fstatat(dirfd, path, reinterpret_cast<struct stat*>(st), flags, pass);
}
inline int on_fstat(int fd, struct stat64* st, Pass<int> pass) {
  return on_fstat(fd, reinterpret_cast<struct stat*>(st), pass);
}
// Reentrancy: calls made while Monarch is already working in this thread go
// straight to the real functions (our own opens, a logger's writes...).
extern __thread int t_depth __attribute__((tls_model("initial-exec")));
inline bool enter() {
  if (t_depth) return false;
  t_depth = 1;
  return true;
}
inline void leave() {
  t_depth = 0;
}

}  // namespace monarch

// The real functions, resolved once with dlsym(RTLD_NEXT, ...).
namespace monarch::real {
#define MONARCH_OPEN(name, params, args, dirfd) extern int (*name)(MONARCH_UNPAREN params, ...);
#define MONARCH_WRAP(ret, name, params, args, handler) extern ret(*name) params;
#define MONARCH_READ MONARCH_WRAP
#define MONARCH_UNPAREN(...) __VA_ARGS__
#include "wrappers.def"
#undef MONARCH_OPEN
#undef MONARCH_WRAP
#undef MONARCH_READ
void resolve();
}  // namespace monarch::real
