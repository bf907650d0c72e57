// The job map: one file per job per node, written by the stager and mapped
// MAP_SHARED by every process of the job. It holds the dataset's index (files
// with size and times, enough to answer stat; directories, enough to resolve a
// path as the kernel would), the state of each file's copy, the progress of
// copies under way, and one slot of counters per thread that touched the
// dataset (written by that thread only, summed by the stager).
//
// Contract: the stager creates the file complete, its space allocated (never
// sparse: a page first touched on a full file system would be SIGBUS), under a
// temporary name and renames it to <job dir>/index, so a process that opens it
// sees a finished index. After that only the atomic fields change. Readers
// never lock: each field they read is a single atomic word.
//
// The map is the user's own file: a process of the job can scribble on it. So
// JobMap copies every count and offset once, when it is opened, checks them
// against the mapped size, and checks every live word (a state, a copy slot, a
// bucket) before use: a damaged map means "read from the PFS", never a signal.
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

inline constexpr char kMagic[8] = {'M', 'O', 'N', 'A', 'R', 'C', 'H', '5'};
inline constexpr int kMapTiers = 4;       // == kMaxTiers in config.h
inline constexpr int kCopySlots = 1024;   // copies under way at once, paused ones included
inline constexpr int kProcSlots = 4096;   // threads with counters; later ones share slot 0
inline constexpr size_t kPathMax = 1024;  // longest root or job directory path
inline constexpr uint16_t kNoAttr = 0xffff;

// File names inside the job directory of the first tier.
inline constexpr const char* kIndexName = "index";
inline constexpr const char* kSocketName = "ctl.sock";
inline constexpr const char* kStatsName = "stats.json";
inline constexpr const char* kLockName = "stager.lock";
inline constexpr const char* kLogName = "stager.log";
inline constexpr const char* kIndexWireName = "index.wire";  // a multi-node job's: jobwide.h

// Inside a tier's job directory: finished copies at data/<path>, copies being
// written at tmp/<generation>-<id> (copy_name, partial_name).
inline constexpr const char* kDataDir = "data";
inline constexpr const char* kTmpDir = "tmp";

// Environment of the processes of a job (set by monarch-run and the plugin).
inline constexpr const char* kEnvDataset = "MONARCH_DATASET";  // the dataset root as given
inline constexpr const char* kEnvJobDir = "MONARCH_JOB_DIR";   // job directory of tier 0
inline constexpr const char* kEnvLog = "MONARCH_LOG";          // "1": log to stderr
// The job directory of every tier, in tier order, separated by ':'.
inline constexpr const char* kEnvJobDirs = "MONARCH_JOB_DIRS";
// Set by the library in a process that said why Monarch cannot serve it:
// the programs it starts do not say it again.
inline constexpr const char* kEnvSaid = "MONARCH_SAID";

// Copy state of one file, in the low 4 bits of its state word. Bits 4-7 hold
// the tier (kCopying, kCached), bits 8-31 the `aux` value: for kClaimed and
// kQueued the time the state was entered (coarse_now()), for kCopying the copy slot.
enum FileState : uint32_t {
  kNone = 0,     // not on any tier, nobody working on it
  kClaimed = 1,  // a reader is reading it whole and will hand the bytes over
  kQueued = 2,   // the stager will copy it soon
  kCopying = 3,  // being written to tmp/<generation>-<id> on the tier
  kCached = 4,   // complete copy at data/<path> on the tier
  kNoRoom = 5,   // no tier had room when it was placed
  kFailed = 6,   // the copy failed (I/O error); read from the PFS
  kStale = 7,    // the PFS file differs from the index, or the job wrote it: PFS only
};
inline constexpr uint32_t kLastState = kStale;

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

// `aux` of kStale: the copy (on the word's tier) is still to be deleted; and
// only names changed (unlink, rename): the file's bytes did not, so an open
// descriptor of its copy still reads the right ones. Without kNamesOnly the
// bytes may have changed (a write, a truncate, another version on the PFS).
inline constexpr uint32_t kCopyToDelete = 1, kNamesOnly = 2;
// `aux` of kCached: the copy was made ahead (stage-ahead), before any reader
// asked for it; and a reader has opened it since. Stage-ahead copies at most
// a window of bytes ahead of what readers have touched (Header::ahead_touched;
// the window: ahead.h).
inline constexpr uint32_t kAhead = 1, kTouched = 2;

// Time in the 24 bits of `aux`: CLOCK_MONOTONIC in units of 2^20 ns (about
// 1 ms), wrapping every 4.9 hours; ages are taken modulo the wrap.
inline constexpr int kCoarseShift = 20;
inline constexpr uint32_t kCoarseMask = 0xffffff;
uint32_t coarse_now();
inline uint64_t coarse_age_ns(uint32_t then, uint32_t now) {
  return uint64_t((now - then) & kCoarseMask) << kCoarseShift;
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

// One dataset directory below the root (the root itself is not listed).
struct DirEntry {
  uint32_t path_off;
  uint16_t path_len;
  uint16_t pad;
  std::atomic<uint32_t> stale;  // renamed or removed by the job: paths through it pass through
  uint32_t pad2;
  uint64_t dev, ino;
};

// A read from the PFS slower than this is a stalled copy's, whatever its size.
inline constexpr uint64_t kSlowestReadBytesPerMs = 100'000;  // 100 MB/s

struct CopySlot {
  std::atomic<uint32_t> file;  // id + 1, 0 when free
  // How much longer than the stall timeout the copy may go without progress:
  // the time its read in flight takes at kSlowestReadBytesPerMs (a read of a
  // large block_size returns no byte before it is done).
  std::atomic<uint32_t> quiet_ms;
  std::atomic<uint64_t> progress;     // bytes written to the temporary copy so far
  std::atomic<uint64_t> progress_ns;  // CLOCK_MONOTONIC of the last progress (or of the start)
  // No progress for the stall timeout and the read in flight's allowance.
  bool stalled(uint64_t now_ns, uint64_t stall_ns) const {
    return now_ns - progress_ns.load(std::memory_order_acquire) >
           stall_ns + uint64_t(quiet_ms.load(std::memory_order_relaxed)) * 1'000'000;
  }
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
  uint64_t stall_ns;  // a reader waits for a copy at most this long without progress
  uint64_t entries_off, strings_off, strings_size, buckets_off, bucket_count, attrs_off, attr_count;
  uint64_t dirs_off, dir_count, dir_buckets_off, dir_bucket_count;
  uint64_t ino_buckets_off,
      ino_bucket_count;  // files by inode: the job's changes found by identity
  uint64_t root_dev, root_ino;
  uint64_t slots_off;
  char root[kPathMax];                  // dataset root, absolute, lexically normal
  char real_root[kPathMax];             // the same, symbolic links resolved
  char tier_dirs[kMapTiers][kPathMax];  // job directory on each tier
  // Each tier's job directory by what it is: a process finds it by this
  // identity wherever its namespace shows it (a container's bind mount).
  uint64_t tier_dev[kMapTiers], tier_ino[kMapTiers];

  // Live fields.
  std::atomic<uint64_t> heartbeat_ns;  // CLOCK_MONOTONIC, every 100 ms while the stager runs
  std::atomic<int32_t> stager_pid;
  std::atomic<uint32_t> stopping;   // the stager is shutting down: do not wait for it
  std::atomic<uint32_t> next_slot;  // next free ProcSlot
  std::atomic<uint64_t> copied_ns;  // CLOCK_MONOTONIC of the last progress of any copy (or start)
  // Bytes of copies made ahead that readers have opened, plus the bytes
  // readers read from the PFS: readers that outrun the copies (epoch 1 of
  // training) pull stage-ahead along.
  std::atomic<uint64_t> ahead_touched;
  // Bytes of copies made ahead that readers have opened, each file once: with
  // the files readers asked for, what widens stage-ahead's window (ahead.h).
  std::atomic<uint64_t> ahead_opened;
  std::atomic<uint32_t> copies_off;  // the dataset's file system is fast: no copy is worth it
  // A multi-node job's stager: a file with no room here is read from another
  // node through it (Request::kPeerRead) rather than from the PFS.
  std::atomic<uint32_t> peer_reads;
  CopySlot copies[kCopySlots];
  // Processes of the job that loaded this map (the library's load_map; a
  // forked child shares its parent's load and is not counted again): none
  // means no process of the job used Monarch on this node. The one that
  // counts first also leaves its command name (PR_GET_NAME), the
  // CLOCK_MONOTONIC time of its load and, last (release), its pid as its own
  // PID namespace sees it: a reader that sees the pid sees the other two.
  std::atomic<uint32_t> attached;
  std::atomic<int32_t> first_attached_pid;
  std::atomic<uint64_t> first_attached_ns;
  char first_attached_comm[16];
  // A process said that a part of the job is not visible to it (a
  // container's mounts): the others on this node need not say it again.
  std::atomic<uint32_t> said_hidden;
  // Bumped when a copy is published (the stager) or a file is marked changed
  // (the library): a process with a mapping of a dataset file then looks
  // whether it moves to its copy or back to the PFS (interpose/mappings.h).
  std::atomic<uint64_t> copies_changed;
};

// Whether the stager that made the job map in the job directory `job_dir_fd`
// has exited or is exiting (its process gone, or a zombie whose threads may
// still hold the job's lock a moment). False while it runs, and when no map
// tells (still indexing). Raw system calls, nothing allocated: the plugin's
// launcher calls it in a child forked from a multi-threaded slurmstepd.
bool map_stager_exited(int job_dir_fd);
// How long a new stager, or the launcher, waits for the lock of a stager
// that has exited (map_stager_exited) before taking it as running.
inline constexpr int kExitedStagerWaitMs = 3000;

// How long a heartbeat stays fresh. Past it, readers stop waiting for copies.
inline constexpr uint64_t kHeartbeatFreshNs = 2'000'000'000;
// How long a file may wait in the copy queue before readers stop waiting for
// it, when no copy at all has moved for the stall timeout (stuck copy threads).
inline constexpr uint64_t kQueueGraceNs = 20'000'000;

// A state word, decoded and checked against the map it came from.
struct State {
  FileState state = kFailed;
  uint32_t tier = 0;
  uint32_t aux = 0;
};

// A view of a mapped job map, with the lookups both sides use. Every count,
// offset and path below is a private copy, checked when the view is made.
class JobMap {
 public:
  JobMap() = default;
  JobMap(void* base, size_t size);  // see valid()/why()

  // Empty when the map is usable; otherwise why not.
  std::string_view why() const { return why_; }
  bool valid() const { return why_.empty(); }

  Header& header() const { return *h_; }
  uint64_t size() const { return files_; }
  uint64_t dirs() const { return dirs_; }
  uint32_t tiers() const { return tiers_; }
  uint64_t generation() const { return generation_; }
  uint32_t consistency() const { return consistency_; }
  uint64_t small_file_max() const { return small_file_max_; }
  uint64_t stall_ns() const { return stall_ns_; }
  const char* root() const { return root_; }
  const char* real_root() const { return real_root_; }
  const char* tier_dir(uint32_t t) const { return tier_dirs_[t < kMapTiers ? t : 0]; }
  uint64_t root_dev() const { return root_dev_; }
  uint64_t root_ino() const { return root_ino_; }
  uint64_t tier_dev(uint32_t t) const { return tier_dev_[t < kMapTiers ? t : 0]; }
  uint64_t tier_ino(uint32_t t) const { return tier_ino_[t < kMapTiers ? t : 0]; }

  // REQUIRES id < size(). The entry's live fields may hold anything: read
  // them through state() and path().
  Entry& entry(uint32_t id) const { return entries_[id]; }
  // The entry's path, or an empty view when its offsets are out of bounds.
  std::string_view path(uint32_t id) const;
  std::string_view dir_path(uint32_t id) const;
  DirEntry& dir(uint32_t id) const { return dir_entries_[id]; }
  const Attr* attr(uint32_t id) const {
    uint16_t a = entries_[id].attr;
    return a < attrs_count_ ? &attrs_[a] : nullptr;
  }
  ProcSlot& slot(uint32_t i) const { return slots_[i]; }
  CopySlot* copy_slot(uint32_t s) const { return s < kCopySlots ? &h_->copies[s] : nullptr; }

  // The file's state, checked: a word that cannot be a state reads as kFailed
  // (the PFS). REQUIRES id < size().
  State state(uint32_t id) const {
    return decode(entries_[id].state.load(std::memory_order_acquire));
  }
  State decode(uint32_t w) const;

  // Id of the file or directory at `rel` (relative to the root, no leading,
  // trailing or double '/', no "." or ".."), or -1.
  int64_t find(std::string_view rel) const;
  int64_t find_dir(std::string_view rel) const;
  // Id of the file or directory with this identity, or -1 (kRootDir: the root).
  // A file with several names (hard links) has an entry per name: for_each_inode.
  int64_t find_inode(uint64_t dev, uint64_t ino) const;
  template <typename F>
  void for_each_inode(uint64_t dev, uint64_t ino, F f) const;
  int64_t find_dir_inode(uint64_t dev, uint64_t ino) const;
  static constexpr int64_t kRootDir = -2;
  // Is `dev` a device some dataset file or directory lives on?
  bool dataset_dev(uint64_t dev) const;

  // Is the stager alive and willing to copy?
  bool stager_alive(uint64_t now_ns) const;
  // Is a file that entered the copy queue `queued_ns` ago stuck there? Yes
  // after the stall timeout, and sooner when no copy has moved for that long.
  bool queue_stuck(uint64_t queued_ns, uint64_t now_ns) const;

  // A reader (here or on another node of the job) opened `file`: a copy made
  // ahead is marked touched, once, and its bytes count as read
  // (Header::ahead_touched), which lets stage-ahead go on. REQUIRES id < size().
  void touch(uint32_t file) const;

  // Fills `st` from the index. Returns false if the index cannot answer exactly.
  bool fill_stat(uint32_t id, struct stat* st) const;

  // Does `st` (of a PFS descriptor or path) show the very version the index holds?
  bool same_version(uint32_t id, const struct stat& st) const;

  static uint64_t hash(std::string_view s);
  static uint64_t hash(uint64_t dev, uint64_t ino) { return (ino * 0x9e3779b97f4a7c15ull) ^ dev; }
  static uint64_t bucket_of(uint64_t hash, uint64_t buckets) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(hash) * buckets) >> 64);
  }

 private:
  template <typename Path>
  int64_t probe(const uint32_t* buckets, uint64_t n, uint64_t count, std::string_view rel,
                Path path) const;

  std::string_view why_ = "not mapped";
  static constexpr int kDevs = 64;  // more, and every device counts as the dataset's
  uint64_t devs_[kDevs] = {};
  int dev_count_ = 0;
  const uint32_t* ino_buckets_ = nullptr;
  uint64_t ino_bucket_count_ = 0, root_dev_ = 0, root_ino_ = 0;
  Header* h_ = nullptr;
  Entry* entries_ = nullptr;
  DirEntry* dir_entries_ = nullptr;
  const char* strings_ = nullptr;
  const uint32_t* buckets_ = nullptr;
  const uint32_t* dir_buckets_ = nullptr;
  const Attr* attrs_ = nullptr;
  ProcSlot* slots_ = nullptr;
  uint64_t files_ = 0, dirs_ = 0, strings_size_ = 0, bucket_count_ = 0, dir_bucket_count_ = 0;
  uint64_t attrs_count_ = 0, generation_ = 0, small_file_max_ = 0, stall_ns_ = 0;
  uint32_t tiers_ = 0, consistency_ = 0;
  char root_[kPathMax] = "", real_root_[kPathMax] = "";
  char tier_dirs_[kMapTiers][kPathMax] = {};
  uint64_t tier_dev_[kMapTiers] = {}, tier_ino_[kMapTiers] = {};
};

// The names of file `file`'s copy relative to a tier's job directory, into
// `out` (no allocation: the library calls them in signal handlers); false
// when the name does not fit or the map holds no path for the file.
bool copy_name(const JobMap& m, uint32_t file, char* out, size_t cap);
bool partial_name(const JobMap& m, uint32_t file, char* out, size_t cap);

template <typename F>
void JobMap::for_each_inode(uint64_t dev, uint64_t ino, F f) const {
  uint64_t n = ino_bucket_count_;
  if (n == 0) return;
  uint64_t b = bucket_of(hash(dev, ino), n);
  for (uint64_t tries = 0; tries < n; ++tries, b = b + 1 == n ? 0 : b + 1) {
    uint32_t v = ino_buckets_[b];
    if (v == 0) return;
    if (v - 1 < files_ && entries_[v - 1].ino == ino) {
      const Attr* a = attr(v - 1);
      if (!a || a->dev == dev) f(uint32_t(v - 1));
    }
  }
}

uint64_t monotonic_ns();
int64_t to_ns(const timespec& t);

// Lexical path handling for the stager and monarch-run (no system calls).
//
// Joins `base` (absolute, may be empty for an absolute `path`) and `path`,
// removes "." and empty components and resolves ".." lexically into `out`.
// Returns the length, or -1 if it does not fit. A trailing '/' is kept.
int normalize_path(std::string_view base, std::string_view path, char* out, size_t cap);

}  // namespace monarch
