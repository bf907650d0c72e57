// The handlers behind the wrappers of wrappers.def: each serves a call on the
// dataset or calls `pass`, the original call with the original arguments.
// Handlers never throw, and errno on return is what the caller would see
// without Monarch. They are plain functions: tests call them directly with a
// job map built in the test (tests/unit/interpose_test.cpp), without LD_PRELOAD.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>

namespace monarch {

namespace real {
// pthread_testcancel, or null: looked up, not linked (before glibc 2.34 it is
// in libpthread, which a program without threads does not load).
extern void (*testcancel)();
}  // namespace real

// A borrowed callable that performs the original call. Lives only during the call.
template <typename R, typename... A>
class PassOf {
 public:
  template <typename F>
  explicit PassOf(F& f)
      : ctx_(&f), fn_([](void* c, A... a) -> R { return (*static_cast<F*>(c))(a...); }) {}
  R operator()(A... a) const { return fn_(ctx_, a...); }

 private:
  void* ctx_;
  R (*fn_)(void*, A...);
};
template <typename R>
using Pass = PassOf<R>;
// The original call with another descriptor in place of its first one: how a
// call on a descriptor of a local copy is made on the PFS file instead.
template <typename R>
using PassFd = PassOf<R, int>;

// ---- open (open.cpp) ----
int on_open(int dirfd, const char* path, int flags, mode_t mode, Pass<int> pass);
FILE* on_fopen(const char* path, const char* mode, Pass<FILE*> pass);
FILE* on_freopen(const char* path, const char* mode, FILE* stream, Pass<FILE*> pass);
// A call that may change the file or directory at `path` (relative to dirfd;
// `follow`: the call follows a final symbolic link): the file's copy is
// dropped before it runs. `names`: it changes only which names lead to the
// file (unlink, rename), not its bytes. `path2` is the second path of rename and link.
int on_change(int dirfd, const char* path, bool follow, bool names, Pass<int> pass);
int on_change2(int dirfd, const char* path, int dirfd2, const char* path2, bool names,
               Pass<int> pass);

// ---- read (read.cpp) ----
// read/readv (positional false: they move the offset) and pread/preadv.
ssize_t on_read(int fd, const struct iovec* iov, int cnt, off_t off, bool positional,
                Pass<ssize_t> pass);
inline ssize_t on_read(int fd, void* buf, size_t n, off_t off, bool positional,
                       Pass<ssize_t> pass) {
  iovec v{buf, n};
  return on_read(fd, &v, 1, off, positional, pass);
}
off_t on_lseek(int fd, off_t off, int whence, Pass<off_t> pass);

// ---- mappings (mappings.cpp; what they promise: mappings.h) ----
void* on_mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off, Pass<void*> pass);
int on_munmap(void* addr, size_t len, Pass<int> pass);
// mremap of [addr, addr + len) (to `to` with MREMAP_FIXED): moved mappings
// there go back to the PFS first.
void* on_mremap(void* addr, size_t len, size_t new_len, int flags, void* to, Pass<void*> pass);
int on_mprotect(void* addr, size_t len, int prot, Pass<int> pass);
int on_madvise(void* addr, size_t len, int advice, Pass<int> pass);
// mlock, mlock2, and mlockall (all: with MCL_CURRENT): locked pages are never moved.
int on_mlock(void* addr, size_t len, bool all, Pass<int> pass);

// ---- what a descriptor looks like (observe.cpp) ----
int on_stat(int dirfd, const char* path, struct stat* st, int flags, Pass<int> pass);
int on_fstat(int fd, struct stat* st, Pass<int> pass);
int on_statx(int dirfd, const char* path, int flags, unsigned mask, struct statx* stx,
             Pass<int> pass, PassFd<int> on_fd);
ssize_t on_readlink(int dirfd, const char* path, char* buf, size_t size, Pass<ssize_t> pass);
// A call on descriptor `fd` that a local copy cannot answer as the PFS file
// would (copy_file_range, sendfile, fstatfs, fchmod...): made on the PFS file.
// `moves`: the call advances fd's offset by its result when `at` is null.
// `changes`: it changes the file, whose copy is then dropped.
template <typename R>
R on_pfs_call(int fd, bool changes, PassFd<R> call, Pass<R> pass);
ssize_t on_transfer(int fd_in, const off_t* at, PassFd<ssize_t> call, Pass<ssize_t> pass);

// ---- descriptors (descriptors.cpp) ----
int on_close(int fd, Pass<int> pass);
int on_fclose(FILE* f, Pass<int> pass);
// A stream on a descriptor (numpy.fromfile: a dup of Python's descriptor):
// its reads are stdio's own, unseen, so it is counted as fopen's streams are
// and asks for the file's copy. One that may write is a change of a file
// opened for reading and writing (changes(), fdtable.h): stdio's writes are
// glibc's own calls, never seen.
FILE* on_fdopen(int fd, const char* mode, Pass<FILE*> pass);
int on_dup(int oldfd, Pass<int> pass);
int on_dup2(int oldfd, int newfd, Pass<int> pass);
int on_fcntl(int fd, int cmd, void* arg, Pass<int> pass);
int on_close_range(unsigned first, unsigned last, int flags, Pass<int> pass);
void on_closefrom(int lowfd, Pass<void> pass);
int on_chdir(Pass<int> pass);
// A posix_spawn file action that will open `path`: for writing, its file is stale.
int on_spawn_open(const char* path, int flags, Pass<int> pass);

// ---- the process (process.cpp) ----
int on_process_change(Pass<int> pass);

// struct stat64 is struct stat on the 64-bit targets Monarch supports.
static_assert(sizeof(struct stat) == sizeof(struct stat64));
inline int on_stat(int dirfd, const char* path, struct stat64* st, int flags, Pass<int> pass) {
  return on_stat(dirfd, path, reinterpret_cast<struct stat*>(st), flags, pass);
}
inline int on_fstat(int fd, struct stat64* st, Pass<int> pass) {
  return on_fstat(fd, reinterpret_cast<struct stat*>(st), pass);
}

// Reentrancy: calls made while Monarch is already working in this thread (our
// own opens, a signal handler that interrupted a wrapper) go straight to the
// real functions. The guard is the stack address of the call that entered: a
// call deeper on the stack is nested; one shallower means the entered call was
// left without returning (siglongjmp out of a signal handler), and the guard
// is taken again instead of staying set for good.
extern __thread uintptr_t t_entered __attribute__((tls_model("initial-exec")));
inline bool enter(uintptr_t frame) {
  if (t_entered && frame < t_entered) return false;
  t_entered = frame;
  return true;
}
inline void leave() {
  t_entered = 0;
}

// No cancellation of this thread while it lives (when `on`): for a lock or
// flag held across a cancellation point (an open, a read, a sleep). The
// library is built without exceptions, so a cancellation that unwinds it
// runs none of its destructors and would leave such a lock taken for good.
// A cancellation requested meanwhile acts at the thread's next cancellation
// point; with `entry`, the scope is the call's own (a read()), and one
// already pending acts first, as at the start of the real call (a thread
// that only reads would otherwise never be cancelled).
class NoCancel {
 public:
  explicit NoCancel(bool on = true, bool entry = false) : on_(on) {
    if (!on_) return;
    if (entry && real::testcancel) real::testcancel();
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_);
  }
  ~NoCancel() {
    if (on_) pthread_setcancelstate(old_, nullptr);
  }
  NoCancel(const NoCancel&) = delete;
  NoCancel& operator=(const NoCancel&) = delete;

 private:
  bool on_;
  int old_ = 0;
};

}  // namespace monarch

// The real functions, resolved once with dlsym(RTLD_NEXT, ...) (real.cpp).
namespace monarch::real {
#define MONARCH_OPEN(name, params, args, dirfd) extern int (*name)(MONARCH_UNPAREN params, ...);
#define MONARCH_WRAP(ret, name, params, args, handler) extern ret(*name) params;
#define MONARCH_VARIADIC(ret, name, params, args, handler) \
  extern ret (*name)(MONARCH_UNPAREN params, ...);
#define MONARCH_READ(ret, name, params, args, handler) extern ret(*name) params;
#define MONARCH_ON_FD MONARCH_READ
#define MONARCH_UNPAREN(...) __VA_ARGS__
#include "wrappers.def"
#undef MONARCH_OPEN
#undef MONARCH_WRAP
#undef MONARCH_VARIADIC
#undef MONARCH_READ
#undef MONARCH_ON_FD
void resolve();
// Is the process's C library glibc? (musl has no gnu_get_libc_version.)
bool libc_is_glibc();
}  // namespace monarch::real
