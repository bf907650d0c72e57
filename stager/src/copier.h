// The copy engine of the stager: one queue for the whole node, readers'
// requests first, then files paused for them, then the stage-ahead backlog
// (smaller files first: size_order.h).
//
// A copy is written to <tier job dir>/tmp/<generation>-<id> in large
// sequential blocks, publishing its progress so that readers can use the part
// already written, then checked against the PFS file (size and mtime as
// indexed: device, inode, size, mtime, ctime, before and after), given the PFS
// file's mtime, and renamed to <tier job dir>/data/<path>. Only then is the
// file marked cached: a reader never sees a partial file under its final name.
//
// Every change of a file's state word is a compare-and-swap from the state the
// copier put it in: a reader that marks a file stale (it opened it for
// writing) always wins, and the copy is then abandoned or deleted.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "counters.h"
#include "fast_fs.h"
#include "jobmap.h"
#include "placement.h"
#include "size_order.h"

namespace monarch {

// The bytes of a file from another node of a multi-node job (issue 9;
// jobwide.h implements it over the network).
class PeerSource {
 public:
  virtual ~PeerSource() = default;
  // The node that copies `file` from the PFS for the job, when it is another
  // node than this one; -1 when this node does.
  virtual int home(uint32_t file) = 0;
  enum class Got {
    kBytes,        // `n` bytes at `off` (0: the end of the file)
    kPending,      // the node is still copying the file: ask again
    kUnavailable,  // the node will not have it (no room, a failed copy): the PFS
    kFailed,       // the node is gone; home() no longer names it
    kNotYet,       // (replica) the node has not copied it yet, and is not asked to
  };
  // replica: a copy made ahead, which the node serves only from a copy it
  // has or is making (never one made for the asking), and which does not
  // count as a reader's (its stage-ahead window, Header::ahead_touched).
  virtual Got read(int node, uint32_t file, uint64_t off, char* buf, size_t len, bool replica,
                   size_t& n) = 0;
  // Whether `node` is not asked for a replica now (its stager is not up
  // yet, or its connection broke): read() would answer at once without
  // asking it.
  virtual bool resting(int node) = 0;
};

struct CopierOptions {
  int root_fd = -1;           // the dataset root, open
  std::vector<int> tier_fds;  // job directory of each tier, open
  std::vector<uint64_t> block_sizes;
  unsigned threads = 4;  // the stager passes copy_threads
  bool stage_ahead = true;
  uint64_t ahead_window = ~0ull;  // stage_ahead_window in bytes (ahead.h)
  bool fast_fs_check = true;      // stop copying when the PFS is as fast as a tier
  // Multi-node jobs: files homed on other nodes are copied from them, by
  // threads of their own (a copy waiting on a peer never holds a thread the
  // peer's own requests to this node need), and stage-ahead copies only the
  // files homed here. nullptr: every file comes from the PFS.
  PeerSource* peers = nullptr;
  unsigned peer_threads = 4;
};

class Copier {
 public:
  Copier(JobMap& map, Placement& placement, CopierOptions options, std::atomic<uint64_t>* counters);
  ~Copier();

  void start();
  // Stops the threads; copies under way are abandoned and their temporary
  // files removed. Idempotent. Returns false when some thread did not stop
  // within `bound_ns` (stuck in a PFS call): the Copier must then never be
  // destroyed (the process ends with _exit). ~0, the default (and the
  // destructor's): no bound, every thread is joined.
  bool stop(uint64_t bound_ns = ~0ull);

  // A reader asked for `file`: copy it before the backlog.
  void place(uint32_t file);
  // A reader read `file` whole into `memfd` from `pfs_fd`, its own descriptor
  // of the PFS file (ownership of both passes here). Accepted only when
  // `pfs_fd` is the version the index holds and `memfd` has its size.
  bool data(uint32_t file, int memfd, int pfs_fd);
  // A reader found the PFS file changed, or the job opened it for writing.
  void stale(uint32_t file);
  // A claim was released or expired: the backlog should look again.
  void rescan();

  // Whether a copy of `file` from the PFS is worth making now (the tiers have
  // room): a peer that asks this node for a file it homes.
  bool copies_on() const { return !map_.header().copies_off.load(); }

  // Periodic: frees claims older than their life (the reader never handed
  // the bytes over) and deletes the copies of files marked stale.
  void reap();

  // How long a claim may wait for its bytes before the file is copied anyway.
  static constexpr uint64_t kClaimLifeNs = 10'000'000'000;

  bool idle() const;            // nothing queued or under way, backlog done
  double fill_seconds() const;  // time from start to the last copy, once idle

 private:
  struct Job {
    uint32_t file;
    bool urgent = false;
    bool ahead = false;  // from the stage-ahead backlog, counted in ahead_bytes_
    int memfd = -1;      // kData: bytes from a reader
    int tier = -1, slot = -1, src = -1, dst = -1;
    int peer = -1;             // the node the bytes come from, -1: the PFS (or memfd)
    bool replica = false;      // made ahead from its home, for this node's readers to come
    bool placed_home = false;  // a file homed here, taken off home_left_
    uint32_t copying = 0;      // the state word begin() set, 0 before
    std::string rel;           // the path begin() read from the map
    uint64_t done = 0;
    uint64_t started_ns = 0;
    // The PFS's open of the file and its first read (the fast-file-system check).
    uint64_t open_ns = 0, first_read_ns = 0, first_read_bytes = 0;
  };
  enum class Outcome { kDone, kPaused, kRetryNextTier, kFromPfs, kNotNow };

  void worker(bool peer);        // a PFS copy thread, or a peer thread
  bool next_job(Job& job);       // false when stopping
  bool next_peer_job(Job& job);  // false when stopping
  // Reads the next block of a peer's copy into buf: bytes, 0 at the end, -1
  // and errno; kFromPfs when the peer cannot serve it.
  ssize_t read_peer(Job& job, char* buf, size_t len, Outcome& fallback);
  void queue(Job job);  // REQUIRES mu_: to the peer threads or the PFS threads
  void run(Job& job);
  Outcome copy_blocks(Job& job);
  bool begin(Job& job);   // reserve a tier and a slot, open files
  void finish(Job& job);  // verify, publish, mark cached
  void abandon(Job& job, FileState state);
  void close_files(Job& job, bool keep_memfd);
  void drop_stale_copy(uint32_t file);
  // The fast-file-system check (fast_fs.h): the first copies' first bytes
  // read again from the PFS and from their tier (sample_tier), and the copy
  // threads' mean rates (judge_the_pfs); the first verdict of fast stops
  // copying.
  void sample_tier(const Job& job, const std::string& name);
  // Times of those reads; false when they could not be made.
  bool read_back(const Job& job, const std::string& name, uint64_t& pfs_ns, uint64_t& tier_ns);
  // This thread's buffer of at least `n` bytes: a copy's blocks, and a copy
  // read back (after the copy is done). nullptr when there is no memory.
  static char* copy_buffer(uint64_t n);
  // No memory for a copy buffer of `bytes`: counted, said once, and this
  // thread rests a moment; no_buffer() then parks `job` in the paused queue.
  void note_no_buffer(uint64_t bytes);
  void no_buffer(Job& job, uint64_t bytes);
  std::atomic<bool> buffer_warned_{false};
  static constexpr int kNoBufferRestMs = 100;
  void judge_the_pfs();
  void stop_copying(const std::string& why);
  std::mutex judge_mu_;
  std::vector<TierSample> samples_;  // REQUIRES judge_mu_
  std::atomic<bool> sampling_{true};
  std::atomic<size_t> read_backs_{0};  // copies read back, done or failed
  std::string tmp_name(uint32_t file) const;
  // Makes the folders of `name` (a path relative to dir_fd) that are missing,
  // outermost first; false and errno when one cannot be made.
  static bool make_parents(int dir_fd, std::string_view name);
  void count(StagerCounter c, uint64_t n = 1) {
    counters_[c].fetch_add(n, std::memory_order_relaxed);
  }
  bool set_state(uint32_t file, uint32_t expect, uint32_t want);

  JobMap& map_;
  Placement& placement_;
  CopierOptions opt_;
  std::atomic<uint64_t>* counters_;
  std::vector<std::thread> threads_;
  size_t peer_threads_ = 0;  // the last ones of threads_

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> urgent_, paused_, peer_;
  SizeOrder backlog_;  // stage-ahead: this node's files
  // Multi-node jobs: the files homed elsewhere, copied from their homes once
  // this node's own backlog is done (its share of the job's cache first),
  // while the tiers have room. Those a home has not copied yet are looked at
  // again, a pass every kReplicaPassNs.
  SizeOrder replicas_;
  // Bytes of files homed here not placed yet: room other nodes' files leave,
  // and a share of the tiers more for the file systems' own blocks, which
  // grow with every copy and which the accounting of copies in whole blocks
  // does not see (measured: a 256 MiB ext4 job image ran short of a 16 MB
  // home file that its accounting had room for).
  std::atomic<uint64_t> home_left_{0};
  uint64_t home_slack_ = 0;
  static constexpr uint64_t kHomeSlackShare = 16;  // 1/16 of the tiers' quotas
  bool replicas_deferred_ = false;
  uint64_t replicas_pass_ns_ = 0;
  static constexpr uint64_t kReplicaPassNs = 500'000'000;
  bool next_replica(Job& job);  // REQUIRES mu_
  uint64_t ahead_bytes_ = 0;    // copies made (or under way) ahead of any reader
  // Bytes of the files readers asked for or handed over, each once (ahead.h).
  uint64_t asked_bytes_ = 0;
  void asked(uint32_t file);      // REQUIRES mu_
  std::vector<bool> asked_once_;  // REQUIRES mu_: files asked() counted
  // A job from the backlog that will not be a copy ahead after all: the
  // bytes it did not read from the PFS leave ahead_bytes_ (those it read stay:
  // the window bounds what stage-ahead reads for nothing too). Takes mu_.
  void unahead(Job& job);
  // Whether the window may grow past the setting: the tiers have room for
  // every file this node copies (ahead.h). Set by start().
  bool window_grows_ = false;
  // Whether a copy of `size` bytes may be made ahead now (ahead.h). REQUIRES mu_
  bool window_room(uint64_t size) const;
  bool rescan_ = false;
  std::atomic<bool> stopping_{false};
  int running_ = 0;
  int held_ = 0;  // readers' bytes queued, not yet being written
  size_t exited_ = 0;
  std::condition_variable exited_cv_;
  static constexpr int kMaxHeld = 256;
  std::vector<int> free_slots_;
  std::atomic<bool> boost_[kCopySlots];  // a reader waits for the copy in this slot
  uint64_t start_ns_ = 0;
  std::atomic<uint64_t> last_copy_ns_{0};
};

}  // namespace monarch
