// Mappings of dataset files follow the copy (issue 26).
//
// A mapping made of a dataset file on the PFS (a numpy.memmap, an LMDB
// environment opened before the file's copy existed) is recorded here, per
// process. Once the file's copy is finished and the file unchanged (kCached),
// the process's next intercepted call replaces the mapping in place by the
// copy's, at the same address with the same protection, flags, file offset and
// advice: the bytes are the same, so the program cannot tell (the kernel's
// /proc/self/maps shows the tier's path). Only mappings that can never have
// been written are moved: no PROT_WRITE at mmap or since, not locked (mlock,
// MAP_LOCKED), whole pages; the copy is opened read-only, so the kernel itself
// refuses any write through a moved mapping. Before a moved mapping is made
// writable (mprotect), remapped (mremap), or its file changed by the job (a
// write anywhere in this process: mark_stale; in another process: at this
// process's next intercepted call), the PFS file is put back in place first.
//
// Before either replacement the kernel's own view of the range is checked
// (PROCMAP_QUERY, else /proc/self/maps): every page still maps that file at
// that offset, unwritable, so a mapping removed behind Monarch's back (a raw
// system call) is never replaced. A replacement maps the new file elsewhere
// first and moves it over the old one with mremap, so a mapping that cannot
// be made leaves the old one as it was.
//
// Nothing here allocates with malloc or holds a lock across a blocking call:
// the table is one anonymous mapping, its lock a flag taken only inside the
// reentrancy guard (a signal handler that interrupts its holder goes straight
// to the real functions).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "handlers.h"

namespace monarch {

class JobMap;

// While this process has recorded mappings: the job map's Header::copies_changed
// (bumped when a copy is published or dropped), else null; and the value the
// last look saw.
extern std::atomic<const std::atomic<uint64_t>*> g_maps_watch;
extern std::atomic<uint64_t> g_maps_seen;

void maps_poll();

// What every intercepted call makes first: one load when the process has no
// recorded mapping, three when nothing changed since the last look.
inline void maps_check() {
  const std::atomic<uint64_t>* w = g_maps_watch.load(std::memory_order_relaxed);
  if (__builtin_expect(w != nullptr, 0) &&
      w->load(std::memory_order_relaxed) != g_maps_seen.load(std::memory_order_relaxed))
    maps_poll();
}

// The job changed `file` (mark_stale): this process's moved mappings of it go
// back to the PFS file, before the change is made.
void maps_stale(JobMap* m, uint32_t file);

// The child of a fork: the table's lock as if free (another thread of the
// parent may have held it), the records as they are (the child has the same
// mappings).
void maps_after_fork();

// For tests: the kernel's view read from /proc/self/maps line by line, as
// on kernels before 6.11 (no PROCMAP_QUERY).
extern bool g_maps_by_lines;

// For tests: the records, as (address, length, moved) triples, into `out`;
// returns how many there are.
int maps_records(uintptr_t* addr, size_t* len, bool* moved, int cap);

}  // namespace monarch
