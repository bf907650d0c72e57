// The descriptor table and the per-thread counters of the interposition
// library: what the read path needs inline in the generated wrappers.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "interpose.h"
#include "jobmap.h"

namespace monarch {

// How a descriptor of a dataset file is served (interpose.cpp explains each).
enum Kind : uint8_t { kUntracked = 0, kLocal, kMem, kPfs, kPfsPlain };

struct FdEntry {
  std::atomic<uint8_t> kind;
  uint8_t tier;
  bool placed;            // a kPlace was sent for it
  bool stream;            // opened by fopen: reads are not seen, the offset is counted at fclose
  bool stale;             // the PFS file differs from the index: stat goes to the PFS
  std::atomic_flag lock;  // kPfs only: switching, partial reads, read()/lseek offsets
  uint32_t file;
  JobMap* map;
  int aux;  // the copy being written, open for partial reads, or -1
};

constexpr int kChunkBits = 10, kChunks = 1024;  // descriptors below 2^20 are tracked
extern std::atomic<FdEntry*> g_chunks[kChunks];

inline FdEntry* tracked(int fd) {
  if (unsigned(fd) >= unsigned(kChunks << kChunkBits)) return nullptr;
  FdEntry* c = g_chunks[fd >> kChunkBits].load(std::memory_order_acquire);
  if (!c) return nullptr;
  FdEntry* e = &c[fd & ((1 << kChunkBits) - 1)];
  return e->kind.load(std::memory_order_acquire) ? e : nullptr;
}

// Counters: one slot per thread in the job map, so that a thread adds to its
// own counters with plain stores (no locked instruction on the read path) and
// they survive _exit. Threads beyond kProcSlots share slot 0, atomically.
struct ThreadSlot {
  JobMap* map;  // the slot belongs to this map (a restarted stager brings another)
  ProcSlot* slot;
  bool shared;      // slot 0: other threads add to it too
  uint32_t sample;  // the thread's local reads: one in 64 is timed, the first one included
};
extern __thread ThreadSlot t_slot __attribute__((tls_model("initial-exec")));

// Gives the calling thread a slot in `m` (out of line: once per thread).
ProcSlot& claim_slot(JobMap* m);

inline ProcSlot& slot(JobMap* m) {
  return t_slot.map == m ? *t_slot.slot : claim_slot(m);
}

inline void add(JobMap* m, int counter, uint64_t n = 1) {
  std::atomic<uint64_t>& c = slot(m).c[counter];
  if (__builtin_expect(t_slot.shared, 0))
    c.fetch_add(n, std::memory_order_relaxed);
  else
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// A read answered from a local copy: two counters, no lock.
inline void count_local(FdEntry* e, ssize_t r) {
  if (r < 0) return;
  add(e->map, c_tier_reads + e->tier, 1);
  add(e->map, c_tier_bytes + e->tier, uint64_t(r));
}

}  // namespace monarch
