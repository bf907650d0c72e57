// The job map: one file per job per node, written by the stager and mapped
// MAP_SHARED by every process of the job. It holds the dataset's index (path,
// size, times: enough to answer stat), the state of each file's copy, the
// progress of copies under way, and one slot of counters per thread that
// touched the dataset (written by that thread only, summed by the stager).
//
// Contract: the stager creates the file complete under a temporary name and
// renames it to <job dir>/index, so a process that opens it sees a finished
// index. After that only the atomic fields change. Readers never lock: each
// field they read is a single atomic word. A restarted stager writes a new
// file with a new generation; processes that mapped the old one keep it.
//
// This header is shared by the stager and the interposition library and must
// not pull in anything beyond the C++ standard library and POSIX.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "counters.h"

namespace monarch {

inline constexpr char kMagic[8] = {'M', 'O', 'N', 'A', 'R', 'C', 'H', '2'};
inline constexpr int kMapTiers = 4;       // == kMaxTiers in config.h
inline constexpr int kCopySlots = 1024;   // copies under way at once, paused ones included
inline constexpr int kProcSlots = 4096;   // processes with counters; later ones share slot 0
inline constexpr size_t kPathMax = 1024;  // longest root or job directory path
inline constexpr uint16_t kNoAttr = 0xffff;

// File names inside the job directory of the first tier.
inline constexpr const char* kIndexName = "index";
inline constexpr const char* kSocketName = "ctl.sock";
inline constexpr const char* kStatsName = "stats.json";
inline constexpr const char* kLockName = "stager.lock";
inline constexpr const char* kLogName = "stager.log";

// Environment of the processes of a job (set by monarch-run and the plugin).
inline constexpr const char* kEnvDataset = "MONARCH_DATASET";  // the dataset root as given
inline constexpr const char* kEnvJobDir = "MONARCH_JOB_DIR";   // job directory of tier 0
inline constexpr const char* kEnvLog = "MONARCH_LOG";          // "1": log to stderr

// Copy state of one file, in the low 4 bits of its state word. Bits 4-7 hold
// the tier (kCopying, kCached), bits 8-31 the claiming pid (kClaimed) or the
// copy slot (kCopying).
enum FileState : uint32_t {
  kNone = 0,     // not on any tier, nobody working on it
  kClaimed = 1,  // a reader is reading it whole and will hand the bytes over
  kQueued = 2,   // a reader asked for it; the stager will copy it soon
  kCopying = 3,  // being written to tmp/<generation>-<id> on the tier
  kCached = 4,   // complete copy at data/<path> on the tier
  kNoRoom = 5,   // no tier had room when it was placed
  kFailed = 6,   // the copy failed (I/O error); read from the PFS
  kStale = 7,    // the PFS file differs from the index; read from the PFS
};

inline constexpr uint32_t make_state(FileState s, uint32_t tier = 0, uint32_t aux = 0) {
  return s | (tier << 4) | (aux << 8);
}
inline constexpr FileState state_of(uint32_t w) {
  return FileState(w & 0xf);
}
inline constexpr uint32_t tier_of(uint32_t w) {
  return (w >> 4) & 0xf;
}
inline constexpr uint32_t aux_of(uint32_t w) {
  return w >> 8;
}

// stat fields that many files share, stored once.
struct Attr {
  uint64_t dev;
  uint32_t mode, uid, gid, nlink;
  uint32_t blksize, pad;
};

// One dataset file. 56 bytes; with its hash bucket and path about 100 bytes.
struct Entry {
  uint32_t path_off;  // relative path (no leading '/') in the string table
  uint16_t path_len;
  uint16_t attr;  // index into the attr table, or kNoAttr: stat goes to the PFS
  std::atomic<uint32_t> state;
  uint32_t blocks;  // st_blocks
  uint64_t ino;
  uint64_t size;
  int64_t mtime_ns, ctime_ns, atime_ns;
};
static_assert(sizeof(Entry) == 56);

struct CopySlot {
  std::atomic<uint32_t> file;  // id + 1, 0 when free
  std::atomic<uint32_t> pad;
  std::atomic<uint64_t> progress;  // bytes written to the temporary copy so far
};

struct alignas(64) ProcSlot {
  std::atomic<int32_t> pid;  // of the process the thread belongs to
  std::atomic<uint32_t> pad;
  std::atomic<uint64_t> c[kNumCounters];
};

struct Header {
  char magic[8];
  uint64_t generation;  // random, new at every stager start
  uint64_t file_size;   // of the whole map file
  uint64_t file_count;
  uint64_t dataset_bytes;
  uint32_t tier_count;
  uint32_t consistency;  // 0 job, 1 open
  uint64_t small_file_max;
  uint64_t entries_off, strings_off, strings_size, buckets_off, bucket_count, attrs_off, attr_count;
  uint64_t slots_off;
  char root[kPathMax];                  // dataset root, absolute, lexically normal
  char real_root[kPathMax];             // the same, symbolic links resolved
  char tier_dirs[kMapTiers][kPathMax];  // job directory on each tier

  // Live fields.
  std::atomic<uint64_t> heartbeat_ns;  // CLOCK_MONOTONIC, every 100 ms while the stager runs
  std::atomic<int32_t> stager_pid;
  std::atomic<uint32_t> stopping;   // the stager is shutting down: do not wait for it
  std::atomic<uint32_t> next_slot;  // next free ProcSlot
  CopySlot copies[kCopySlots];
};

// How long a heartbeat stays fresh. Past it, readers stop waiting for copies.
inline constexpr uint64_t kHeartbeatFreshNs = 2'000'000'000;

// A read-only view of a mapped job map, with the lookups both sides use.
class JobMap {
 public:
  JobMap() = default;
  JobMap(void* base, size_t size);  // does not check; see validate()

  // Empty when the map is usable; otherwise why not.
  std::string_view validate() const;

  Header& header() const { return *h_; }
  uint64_t size() const { return h_->file_count; }
  Entry& entry(uint32_t id) const { return entries_[id]; }
  std::string_view path(uint32_t id) const {
    return {strings_ + entries_[id].path_off, entries_[id].path_len};
  }
  const Attr* attr(uint32_t id) const {
    uint16_t a = entries_[id].attr;
    return a == kNoAttr ? nullptr : &attrs_[a];
  }
  ProcSlot& slot(uint32_t i) const { return slots_[i]; }

  // Id of the file at `rel` (relative to the root, normal form), or -1.
  int64_t find(std::string_view rel) const;

  // Is the stager alive and willing to copy?
  bool stager_alive(uint64_t now_ns) const;

  // Fills `st` from the index. Returns false if the index cannot answer exactly.
  bool fill_stat(uint32_t id, struct stat* st) const;

  static uint64_t hash(std::string_view s);
  static uint64_t bucket_of(uint64_t hash, uint64_t buckets) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(hash) * buckets) >> 64);
  }

 private:
  Header* h_ = nullptr;
  Entry* entries_ = nullptr;
  const char* strings_ = nullptr;
  const uint32_t* buckets_ = nullptr;
  const Attr* attrs_ = nullptr;
  ProcSlot* slots_ = nullptr;
};

uint64_t monotonic_ns();

// Lexical path handling for the interposer (no system calls).
//
// Joins `base` (absolute, may be empty for an absolute `path`) and `path`,
// removes "." and empty components and resolves ".." lexically into `out`.
// Returns the length, or -1 if it does not fit. A trailing '/' is kept, since
// "file/" must fail with ENOTDIR as it would without Monarch.
int normalize_path(std::string_view base, std::string_view path, char* out, size_t cap);

// If `abs` (normal form) is `root` or lies under it, returns the part after
// "root/"; otherwise returns an empty view with data() == nullptr.
std::string_view under_root(std::string_view abs, std::string_view root);

}  // namespace monarch
