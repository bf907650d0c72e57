// The descriptor table of the interposition library: what Monarch knows of the
// descriptors it opened, and the per-thread counters; what the read path needs
// inline in the generated wrappers.
//
// Monarch never puts one file in place of another behind a descriptor number
// the program holds. A dataset file is served by one of two kinds of
// descriptor, decided once, at open, for the descriptor's whole life:
//   kLocal  the file was cached at open: the program holds a descriptor of
//           the local copy itself; reads run natively on it, and what the
//           copy cannot answer as the PFS file would (stat, /proc/self/fd,
//           copy_file_range...) is answered from the index or made on the PFS.
//   kPfs    the program holds its own descriptor of the PFS file, so every
//           call the kernel answers from the descriptor (offsets shared with
//           dup and fork, flags, locks, identity) is the PFS's. Monarch only
//           serves its reads, from the bytes read whole at open (small files)
//           or from the copy, once it has checked, at that very call, that
//           the descriptor is still the dataset file in the indexed version.
// A table entry is a claim about a descriptor number, so it can go stale when
// the number is closed or reused behind Monarch's back (closefrom, a raw
// system call...). Every use that could serve wrong bytes checks the claim
// against the kernel first (identity(), in fdtable.cpp); only native reads of
// a copy, which are right whatever the table says, skip the check.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "jobmap.h"

namespace monarch {

enum Kind : uint8_t { kUntracked = 0, kLocal, kPfs };

// The bytes that serve a kPfs descriptor's reads without a call on a file:
// a small file read whole at open (tier < 0), or the finished copy of the
// file mapped once (the copy's tier). Shared by the entries of one
// descriptor's duplicates (dup, dup2, fcntl); unmapped with the last of them.
// Made and freed with mmap and munmap, never malloc: open and close stay
// async-signal-safe, as the kernel's are (a signal handler may call them).
struct Whole {
  std::atomic<int> refs;
  char* data;
  uint64_t size;
  int tier;
};
Whole* make_whole(char* data, uint64_t size, int tier = -1);  // null when it cannot be mapped

inline constexpr uint8_t kNoView = 0xff;  // FdEntry::view when the path is not known

struct FdEntry {
  std::atomic<uint8_t> kind;
  uint8_t tier;   // kLocal: the copy's tier
  uint8_t view;   // kLocal: the view of the dataset root the program named the file through
  bool shared;    // dup'd or inherited: the offset may move under us, read() is not emulated
  bool gave_up;   // kPfs: never served from a copy again (stall, version, failure)
  bool placed;    // kPfs: a kPlace was sent for it
  bool stream;    // a stdio stream's (fopen, fdopen): reads are not seen, counted at fclose
  bool switched;  // kPfs: already counted as reading from a finished copy
  bool direct;    // kLocal: O_DIRECT set since open: reads are made on the PFS file
  bool writable;  // kPfs: opened for reading and writing (its file is not stale until it writes)
  std::atomic_flag lock;  // kPfs: emulated read() and lseek of one descriptor, between threads
  uint32_t file;
  uint32_t ofd;  // the open file (kernel's open file description): shared by duplicates
  JobMap* map;
  uint64_t dev, ino;     // kLocal: the copy's identity, checked before the table is believed
  Whole* whole;          // kPfs: the bytes read whole at open, or null
  uint64_t stream_from;  // stream: the offset it started reading at
};

constexpr int kChunkBits = 10, kChunks = 1024;  // descriptors below 2^20 are tracked
constexpr int kTableLimit = kChunks << kChunkBits;
extern std::atomic<FdEntry*> g_chunks[kChunks];

inline FdEntry* tracked(int fd) {
  if (unsigned(fd) >= unsigned(kTableLimit)) return nullptr;
  FdEntry* c = g_chunks[fd >> kChunkBits].load(std::memory_order_acquire);
  if (!c) return nullptr;
  FdEntry* e = &c[fd & ((1 << kChunkBits) - 1)];
  return e->kind.load(std::memory_order_acquire) ? e : nullptr;
}

// A read the kernel answers right on its own: a local copy whose bytes nobody
// changed (names may have: the copy still holds what this descriptor's file holds).
inline bool native_read(const FdEntry* e) {
  if (e->kind.load(std::memory_order_relaxed) != kLocal || e->direct) return false;
  uint32_t w = e->map->entry(e->file).state.load(std::memory_order_relaxed);
  return state_of(w) != kStale || (aux_of(w) & kNamesOnly);
}

// The entry for `fd`, made if needed (null above the table's limit).
FdEntry* slot_for(int fd);
// Starts tracking `fd` (replacing whatever the entry said).
FdEntry* track(int fd, JobMap* m, uint32_t file, Kind kind);
// Tracks `fd` as a descriptor of a local copy if the kernel names it one of
// the job's copies (opened through /proc/self/fd/N, inherited through exec...).
FdEntry* track_copy(int fd, bool shared);
// Forgets `fd`'s entry, if any.
void untrack(int fd);
void untrack(FdEntry* e);
// `to` becomes a duplicate of `from` (dup, dup2, fcntl): both are marked shared.
void duplicate(FdEntry* from, int to);
// Before a call that may change the file through the open file `e` stands
// for (a write, a truncate, a stream that writes, a writable shared
// mapping): the file is marked stale in the job map (Change::kBytes) when
// that open file can write, before the call is made. Any process may call
// it, a vfork child too (the map is shared; the mark is all it does).
// (open.cpp)
void changes(FdEntry* e);
// The same for descriptor `fd`: one table lookup when Monarch does not track it.
inline void changes(int fd) {
  if (FdEntry* e = tracked(fd)) changes(e);
}
// Calls f(fd, entry) for every tracked descriptor.
template <typename F>
void for_each_tracked(F f) {
  for (int c = 0; c < kChunks; ++c) {
    FdEntry* chunk = g_chunks[c].load(std::memory_order_acquire);
    if (!chunk) continue;
    for (int i = 0; i < (1 << kChunkBits); ++i)
      if (chunk[i].kind.load(std::memory_order_relaxed)) f((c << kChunkBits) + i, &chunk[i]);
  }
}

// Is the table's claim about `fd` still true? For kLocal: the descriptor is
// still the copy it opened. For kPfs: it is still the dataset file, in the
// version the index holds (checked on the kernel's cached attributes, which
// costs the PFS nothing). A false claim is forgotten here.
bool identity(int fd, FdEntry* e);

// The fields of `sx` that JobMap::same_version compares (device, inode,
// size, mtime, ctime), in a struct stat; the others are zero.
struct stat version_of(const struct statx& sx);

struct EntryLock {
  FdEntry* e;
  explicit EntryLock(FdEntry* entry);
  ~EntryLock() { e->lock.clear(std::memory_order_release); }
};

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

inline void add(ProcSlot& s, int counter, uint64_t n = 1) {
  std::atomic<uint64_t>& c = s.c[counter];
  if (__builtin_expect(t_slot.shared, 0))
    c.fetch_add(n, std::memory_order_relaxed);
  else
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}
inline void add(JobMap* m, int counter, uint64_t n = 1) {
  add(slot(m), counter, n);
}

// A read answered from a local copy: two counters, no lock.
inline void count_local(FdEntry* e, ssize_t r) {
  if (r < 0) return;
  ProcSlot& s = slot(e->map);
  add(s, c_tier_reads + e->tier, 1);
  add(s, c_tier_bytes + e->tier, uint64_t(r));
}

// Where a read's bytes came from, for the counters. kStream: what a stdio
// stream consumed of the file (its copy or the PFS file, by the entry's
// kind), known only from its position at fclose (its reads are stdio's own):
// counted as the reads the kernel saw (stream_reads), but no evidence for
// stage-ahead, since a position is not bytes read (a stream seeked to its
// end, closed again and again, read nothing).
enum class Source { kLocal, kWhole, kPeer, kPfs, kStream };

// The read calls a stdio stream made to consume `bytes` of a file of `size`
// bytes: glibc reads through a buffer of min(BUFSIZ, st_blksize) bytes
// (libio's filedoalloc; `a`: the file's indexed stat, null: BUFSIZ), one
// read a buffer, and one more that finds the end of a file read to its end.
// Exact for loops of freads, fgets or fscanf smaller than the buffer; a
// fread of a whole buffer or more goes to the kernel in one read, which this
// over-counts by as many times as the fread is larger (measured:
// tests/engine/test_counts.py).
inline uint64_t stream_reads(uint64_t bytes, uint64_t size, const Attr* a) {
  uint64_t buf = 8192;  // BUFSIZ
  if (a && a->blksize > 0 && a->blksize < buf) buf = a->blksize;
  return (bytes + buf - 1) / buf + (bytes >= size ? 1 : 0);
}
void count_read(FdEntry* e, Source source, ssize_t r, uint64_t ns = 0);

// A mapping of dataset file `file` that the kernel made, `len` bytes from
// offset `off`, of a node-local copy (`local`) or of the PFS file. Its pages
// are read later, unseen: it is counted apart from reads (mmaps, mmap_bytes:
// the part of the span inside the file), never as bytes read.
void count_mapping(JobMap* m, uint32_t file, uint64_t off, uint64_t len, bool local);

}  // namespace monarch
