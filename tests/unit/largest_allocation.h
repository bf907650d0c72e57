// The largest single allocation the test's process made since it was last
// set to 0: a test includes this once, and asserts that what a stranger
// sends (an answer longer than allowed, a message out of shape) is never
// allocated. Replaces the global operator new and delete.
#pragma once

#include <atomic>
#include <cstdlib>
#include <new>

inline std::atomic<size_t> largest_allocation{0};

void* operator new(size_t n) {
  size_t seen = largest_allocation.load(std::memory_order_relaxed);
  while (n > seen && !largest_allocation.compare_exchange_weak(seen, n)) {
  }
  if (void* p = malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
__attribute__((noinline)) void operator delete(void* p) noexcept {
  free(p);
}
__attribute__((noinline)) void operator delete(void* p, size_t) noexcept {
  free(p);
}
