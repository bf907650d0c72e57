// Test tool (LD_PRELOAD): a node short of memory for a while. Anonymous maps
// of 1 MiB or more fail with ENOMEM in the stager's copy threads (the
// threads named monarch-copy) during MONARCH_TEST_NOMEM_SECONDS counted from
// the first such map; every other map, thread and process is left alone.
// (Counted from the first copy, not from the process's start: on a loaded
// machine the walk alone can outlast a window counted from the start.)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>

static _Atomic double started;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int refused(size_t len, int flags) {
  const char* s = getenv("MONARCH_TEST_NOMEM_SECONDS");
  char name[16] = "";
  if (!s || !(flags & MAP_ANONYMOUS) || len < (1u << 20)) return 0;
  prctl(PR_GET_NAME, name, 0, 0, 0);
  if (strcmp(name, "monarch-copy") != 0) return 0;
  double first = 0;
  atomic_compare_exchange_strong(&started, &first, now());
  return now() - started < atof(s);
}

void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  static void* (*real)(void*, size_t, int, int, int, off_t);
  if (!real) real = (void* (*)(void*, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
  if (refused(len, flags)) {
    errno = ENOMEM;
    return MAP_FAILED;
  }
  return real(addr, len, prot, flags, fd, off);
}

void* mmap64(void* addr, size_t len, int prot, int flags, int fd, off_t off) {
  return mmap(addr, len, prot, flags, fd, off);
}
