#include "copier.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "ahead.h"

namespace monarch {
namespace {

// A path the index can hold: relative, no empty, "." or ".." component. (The
// map is the user's file: a damaged one must not make the stager write elsewhere.)
bool clean_rel(std::string_view rel) {
  if (rel.empty() || rel.front() == '/' || rel.back() == '/') return false;
  for (size_t at = 0; at <= rel.size();) {
    size_t end = rel.find('/', at);
    if (end == std::string_view::npos) end = rel.size();
    std::string_view c = rel.substr(at, end - at);
    if (c.empty() || c == "." || c == "..") return false;
    at = end + 1;
  }
  return true;
}

bool no_space(int err) {
  return err == ENOSPC || err == EDQUOT;
}

// A copy that failed, by what failed it: `err` the errno of the call that
// failed (0: none, e.g. a path the stager will not copy). The report names
// it: permission denied apart (the job's own reads of the file fail too),
// and the last other one by its name.
void count_copy_error(std::atomic<uint64_t>* counters, int err) {
  counters[s_copy_errors].fetch_add(1, std::memory_order_relaxed);
  if (err == EACCES || err == EPERM)
    counters[s_copy_denied].fetch_add(1, std::memory_order_relaxed);
  else if (err > 0)
    counters[s_copy_errno].store(uint64_t(err), std::memory_order_relaxed);
}

}  // namespace

Copier::Copier(JobMap& map, Placement& placement, CopierOptions options,
               std::atomic<uint64_t>* counters)
    : map_(map),
      placement_(placement),
      opt_(std::move(options)),
      counters_(counters),
      asked_once_(map.size()) {
  for (int s = kCopySlots - 1; s >= 0; --s) free_slots_.push_back(s);
  for (auto& b : boost_) b = false;
}

Copier::~Copier() {
  stop();
}

void Copier::start() {
  start_ns_ = monotonic_ns();
  map_.header().copied_ns.store(start_ns_);
  // Smaller files first (size_order.h). In a multi-node job, each node
  // stages ahead the files homed on it, then the others' (replicas), and
  // stage-ahead's window may grow where the tiers have room now for the disk
  // space of every file this node still copies from the PFS (in the largest
  // of the tiers' blocks; copies adopted from an earlier stager hold theirs
  // already), less a sixteenth for the file systems' own blocks.
  const Entry* entries = map_.size() ? &map_.entry(0) : nullptr;
  std::vector<bool> own(opt_.peers ? map_.size() : 0);
  uint64_t need = 0;
  for (uint32_t i = 0; i < map_.size(); ++i) {
    bool mine = !opt_.peers || opt_.peers->home(i) < 0;
    if (opt_.peers) own[i] = mine;
    if (!mine) continue;
    FileState st = state_of(map_.entry(i).state.load());
    if (opt_.peers && st == kNone) home_left_ += map_.entry(i).size;
    if (st == kCached) continue;
    uint64_t most = 0;
    for (int t = 0; t < placement_.tiers(); ++t)
      most = std::max(most, placement_.footprint(t, map_.entry(i).size));
    need += most;
  }
  uint64_t room = placement_.room_all();
  window_grows_ = room - room / kHomeSlackShare >= need;
  if (opt_.peers) {
    for (int t = 0; t < placement_.tiers(); ++t)
      home_slack_ += placement_.quota(t) / kHomeSlackShare;
    backlog_.reset(entries, map_.size(), own);
    own.flip();
    replicas_.reset(entries, map_.size(), own);
    replicas_pass_ns_ = monotonic_ns();
  } else {
    backlog_.reset(entries, map_.size());
  }
  for (unsigned i = 0; i < opt_.threads; ++i)
    threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "monarch-copy");  // for ps, gdb, and fault tests
      worker(false);
    });
  for (unsigned i = 0; opt_.peers && i < opt_.peer_threads; ++i, ++peer_threads_)
    threads_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "monarch-peer");
      worker(true);
    });
}

bool Copier::stop(uint64_t bound_ns) {
  {
    std::unique_lock lock(mu_);
    if (stopping_ && threads_.empty()) return true;
    stopping_ = true;
    cv_.notify_all();
    // A copy thread inside a PFS call that never returns (a hung PFS keeps a
    // process in uninterruptible sleep) cannot be joined: after the bound it
    // is left behind, and the caller must not wait for it either.
    // No bound (~0, the default): wait for them all. (As a signed count of
    // nanoseconds ~0 is -1: a deadline already past, every thread left.)
    auto all_exited = [this] { return exited_ == threads_.size(); };
    bool exited = true;
    if (bound_ns >= uint64_t(std::numeric_limits<int64_t>::max()))
      exited_cv_.wait(lock, all_exited);
    else
      exited = exited_cv_.wait_until(
          lock, std::chrono::steady_clock::now() + std::chrono::nanoseconds(bound_ns), all_exited);
    if (!exited) {
      spdlog::warn("{} copy threads are stuck in the PFS; leaving them", threads_.size() - exited_);
      for (auto& t : threads_) t.detach();
      threads_.clear();
      return false;
    }
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::deque<Job> paused, urgent;
  {
    std::lock_guard lock(mu_);
    paused.swap(paused_);
    urgent.swap(urgent_);
    urgent.insert(urgent.end(), peer_.begin(), peer_.end());
    peer_.clear();
  }
  for (Job& j : paused) abandon(j, kNone);
  for (Job& j : urgent) {
    if (j.memfd >= 0) close(j.memfd), held_--;
    uint32_t w = map_.entry(j.file).state.load();
    if (state_of(w) == kQueued || state_of(w) == kClaimed) set_state(j.file, w, make_state(kNone));
  }
  return true;
}

bool Copier::set_state(uint32_t file, uint32_t expect, uint32_t want) {
  return map_.entry(file).state.compare_exchange_strong(expect, want);
}

void Copier::place(uint32_t file) {
  if (file >= map_.size() || map_.header().copies_off.load()) return count(s_ignored);
  uint32_t s = map_.entry(file).state.load();
  if (state_of(s) == kNone && set_state(file, s, make_state(kQueued, 0, coarse_now()))) {
    std::lock_guard lock(mu_);
    asked(file);
    queue(Job{.file = file, .urgent = true});
    return;
  }
  if (state_of(s) == kQueued || state_of(s) == kCopying) {
    std::lock_guard lock(mu_);
    if (State st = map_.decode(s); st.state == kCopying) boost_[st.aux] = true;
    for (auto it = paused_.begin(); it != paused_.end(); ++it)
      if (it->file == file) {  // resume it first
        Job j = *it;
        j.urgent = true;
        paused_.erase(it);
        urgent_.push_front(j);
        cv_.notify_one();
        break;
      }
    return;
  }
  count(s_ignored);
}

bool Copier::data(uint32_t file, int memfd, int pfs_fd) {
  // The bytes are taken only from a reader that proves where they come from:
  // it read them from `pfs_fd`, which must be the very version the index holds.
  struct stat pst, mst;
  bool ok = file < map_.size() && !map_.header().copies_off.load() &&
            state_of(map_.entry(file).state.load()) == kClaimed && fstat(pfs_fd, &pst) == 0 &&
            S_ISREG(pst.st_mode) && map_.same_version(file, pst) && fstat(memfd, &mst) == 0 &&
            S_ISREG(mst.st_mode) && uint64_t(mst.st_size) == map_.entry(file).size;
  close(pfs_fd);
  if (!ok) {
    close(memfd);
    count(s_ignored);
    return false;
  }
  std::lock_guard lock(mu_);
  // Bytes wait in memory until a copy thread writes them: bounded, so that
  // stuck copy threads cannot make the stager hold the whole dataset.
  if (held_ >= kMaxHeld) {
    close(memfd);
    count(s_ignored);
    return false;
  }
  held_++;
  asked(file);
  urgent_.push_back(Job{.file = file, .urgent = true, .memfd = memfd});
  cv_.notify_one();
  return true;
}

void Copier::asked(uint32_t file) {
  // Once a file (a claim reaped and made again, a copy retried, a reader
  // that hands the same bytes over twice) and on the file's home only: one
  // node's readers, or another node's through it, show the job reads it
  // once for the whole job.
  if (asked_once_[file] || (opt_.peers && opt_.peers->home(file) >= 0)) return;
  asked_once_[file] = true;
  asked_bytes_ += map_.entry(file).size;
}

void Copier::note_no_buffer(uint64_t bytes) {
  count(s_no_buffer);
  if (!buffer_warned_.exchange(true))
    spdlog::warn("no memory for a copy buffer of {} bytes: copies wait for it", bytes);
  std::this_thread::sleep_for(std::chrono::milliseconds(kNoBufferRestMs));
}

void Copier::no_buffer(Job& job, uint64_t bytes) {
  note_no_buffer(bytes);
  std::lock_guard lock(mu_);
  paused_.push_back(job);
  cv_.notify_one();
}

void Copier::unahead(Job& job) {
  if (!job.ahead) return;
  std::lock_guard lock(mu_);
  uint64_t size = map_.entry(job.file).size, left = size - std::min(size, job.done);
  ahead_bytes_ -= std::min(ahead_bytes_, left);
  job.ahead = false;
}

void Copier::queue(Job job) {
  job.peer = opt_.peers ? opt_.peers->home(job.file) : -1;
  (job.peer >= 0 ? peer_ : urgent_).push_back(job);
  cv_.notify_all();  // one condition for both kinds of threads
}

void Copier::stale(uint32_t file) {
  if (file >= map_.size()) return count(s_ignored);
  for (;;) {
    uint32_t w = map_.entry(file).state.load();
    State s = map_.decode(w);
    if (s.state == kStale) {
      drop_stale_copy(file);
      return;
    }
    if (s.state == kCached) {  // mark it first: no reader opens the copy once it is marked
      if (set_state(file, w, make_state(kStale, s.tier, kCopyToDelete))) continue;
    } else if (s.state == kNone || s.state == kNoRoom || s.state == kFailed) {
      if (set_state(file, w, make_state(kStale))) return count(s_stale);
    } else {
      // kQueued, kCopying, kClaimed: the copy is checked against the PFS
      // before it is published, and a reader's kStale mark makes it abandoned.
      return;
    }
  }
}

void Copier::drop_stale_copy(uint32_t file) {
  uint32_t w = map_.entry(file).state.load();
  State s = map_.decode(w);
  if (s.state != kStale || !(s.aux & kCopyToDelete) || s.tier >= opt_.tier_fds.size() ||
      !set_state(file, w, make_state(kStale, 0, s.aux & kNamesOnly)))
    return;
  std::string name = std::string(kDataDir) + "/" + std::string(map_.path(file));
  unlinkat(opt_.tier_fds[s.tier], name.c_str(), 0);
  placement_.release(s.tier, map_.entry(file).size);
  count(s_stale);
}

void Copier::rescan() {
  std::lock_guard lock(mu_);
  rescan_ = true;
  cv_.notify_one();
}

void Copier::reap() {
  bool freed = false;
  uint32_t now = coarse_now();
  uint64_t claim_limit = std::max<uint64_t>(kClaimLifeNs, 20 * map_.stall_ns());
  for (uint64_t i = 0; i < map_.size(); ++i) {
    uint32_t w = map_.entry(i).state.load(std::memory_order_relaxed);
    State s = map_.decode(w);
    if (s.state == kStale && (s.aux & kCopyToDelete)) drop_stale_copy(uint32_t(i));
    // A claim whose bytes never came (the reader died, hangs, or its
    // datagram was lost): the file is free to copy again.
    if (s.state == kClaimed && coarse_age_ns(s.aux, now) > claim_limit)
      freed |= set_state(uint32_t(i), w, make_state(kNone));
  }
  if (freed) rescan();
}

void Copier::judge_the_pfs() {
  if (!opt_.fast_fs_check || counters_[s_copies_off].load()) return;
  Verdict v = fast_by_rates(counters_[s_pfs_opens].load(), counters_[s_pfs_open_ns].load(),
                            counters_[s_pfs_bytes].load(), counters_[s_pfs_read_ns].load());
  if (v.fast)
    stop_copying(fmt::format("open {:.0f} us, reads {:.2f} GB/s per thread", v.open_us, v.read));
}

namespace {
// A copy thread's buffer, mapped: page-aligned, since a direct-I/O read
// (FUSE's, as the emulated PFS's) is cut into requests at page boundaries of
// the buffer (malloc's 16-byte offset made every 4 MiB read three requests:
// 2 MiB - 16, 2 MiB and 16 bytes), and given back to the system when the
// thread has nothing to copy. Not zeroed: its pages are taken as reads fill
// them, so a thread that copies only small files holds only what they need.
struct CopyBuffer {
  char* data = nullptr;
  uint64_t size = 0;
  void release() {
    if (data) munmap(data, size);
    data = nullptr, size = 0;
  }
  ~CopyBuffer() { release(); }
};
thread_local CopyBuffer t_buffer;
}  // namespace

char* Copier::copy_buffer(uint64_t n) {
  if (t_buffer.size < n) {
    t_buffer.release();
    uint64_t page = uint64_t(sysconf(_SC_PAGESIZE)), bytes = (n + page - 1) / page * page;
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    t_buffer.data = static_cast<char*>(p), t_buffer.size = bytes;
  }
  return t_buffer.data;
}

bool Copier::read_back(const Job& job, const std::string& name, uint64_t& pfs_ns,
                       uint64_t& tier_ns) {
  int fd = openat(opt_.tier_fds[job.tier], name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  // The copy's first bytes read again from the PFS file, then from the copy,
  // each as a reader reads a file the page cache no longer holds (the copy
  // written back first; a tier in memory keeps its pages, and reads as fast
  // as memory), back to back in one thread and into one buffer: the same
  // load for both. (The copy's own first read took 1.8-2.6x the read back
  // in a fifth to a third of the runs on one disk: it also read the file's
  // metadata, into pages of a buffer mapped anew, while other copies ran.)
  uint64_t n = job.first_read_bytes;
  char* buf = copy_buffer(n);
  auto timed = [&](int f, uint64_t& ns) {
    if (posix_fadvise(f, 0, off_t(n), POSIX_FADV_DONTNEED) != 0) return false;
    uint64_t t0 = monotonic_ns();
    bool read = pread(f, buf, n, 0) == ssize_t(n);
    ns = std::max<uint64_t>(monotonic_ns() - t0, 1);
    return read;
  };
  bool ok = buf &&
            sync_file_range(fd, 0, off_t(n),
                            SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                                SYNC_FILE_RANGE_WAIT_AFTER) == 0 &&
            timed(job.src, pfs_ns);
  if (ok) count(s_check_bytes, n);
  ok = ok && timed(fd, tier_ns);
  close(fd);
  return ok;
}

void Copier::sample_tier(const Job& job, const std::string& name) {
  if (!opt_.fast_fs_check || map_.header().copies_off.load()) return;
  // A slow open already says the file system is no tier: that file counts
  // against it, and its copy is not read back (no cost for a real PFS).
  uint64_t pfs_ns = job.first_read_ns, tier_ns = 0;
  if (fast_open(job.open_ns)) {
    // At most twice the samples the check takes: one that keeps failing
    // (the file changes, the tier refuses fadvise) stops reading the PFS.
    if (read_backs_.fetch_add(1) >= 2 * kJudgeFiles * kJudgeWindows) sampling_ = false;
    if (!sampling_ || !read_back(job, name, pfs_ns, tier_ns)) return;
    if (read_back_cached(job.first_read_ns, pfs_ns)) {
      count(s_check_cached);
      return;
    }
  }
  std::lock_guard lock(judge_mu_);
  if (!sampling_) return;
  samples_.push_back({job.open_ns, pfs_ns, tier_ns});
  if (samples_.size() % kJudgeFiles) return;
  if (samples_.size() >= kJudgeFiles * kJudgeWindows) sampling_ = false;
  Verdict v = fast_by_tier(samples_);
  spdlog::debug(
      "fast-file-system check, {} files: PFS open {:.0f} us, PFS reads {:.2f}x the tier's",
      samples_.size(), v.open_us, v.read);
  if (v.fast)
    stop_copying(fmt::format("open {:.0f} us, reads {:.2f}x the tier's", v.open_us, v.read));
}

void Copier::stop_copying(const std::string& why) {
  uint64_t on = 0;
  if (!counters_[s_copies_off].compare_exchange_strong(on, 1)) return;
  spdlog::info(
      "the dataset's file system is as fast as a local tier ({}): no more copies, the job reads "
      "it directly",
      why);
  sampling_ = false;
  map_.header().copies_off.store(1, std::memory_order_release);
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

bool Copier::idle() const {
  std::lock_guard lock(mu_);
  return urgent_.empty() && paused_.empty() && peer_.empty() && running_ == 0 && !rescan_ &&
         (!opt_.stage_ahead || backlog_.done());
}

double Copier::fill_seconds() const {
  uint64_t last = last_copy_ns_.load();
  return last ? (last - start_ns_) / 1e9 : 0;
}

void Copier::worker(bool peer) {
  Job job;
  while (peer ? next_peer_job(job) : next_job(job)) {
    run(job);
    std::lock_guard lock(mu_);
    running_--;
  }
  std::lock_guard lock(mu_);
  exited_++;
  exited_cv_.notify_all();
}

bool Copier::next_peer_job(Job& job) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (stopping_) return false;
    if (!peer_.empty()) {
      job = peer_.front();
      peer_.pop_front();
      running_++;
      return true;
    }
    if (next_replica(job)) {
      running_++;
      return true;
    }
    t_buffer.release();                                  // as a copy thread's, below
    cv_.wait_for(lock, std::chrono::milliseconds(100));  // replicas: homes copy meanwhile
  }
}

bool Copier::next_replica(Job& job) {
  if (!opt_.stage_ahead || map_.header().copies_off.load(std::memory_order_relaxed) ||
      !backlog_.done())
    return false;
  if (replicas_.current() < 0) {
    if (!replicas_deferred_ || monotonic_ns() - replicas_pass_ns_ < kReplicaPassNs) return false;
    replicas_pass_ns_ = monotonic_ns();
    // No pass over every file while no home may be asked (the job's other
    // nodes not up yet, maybe for as long as its batch step runs alone).
    if (opt_.peers->all_resting()) return false;
    replicas_.rewind(), replicas_deferred_ = false;
  }
  for (int64_t id; (id = replicas_.current()) >= 0;) {
    replicas_.advance();
    uint32_t f = uint32_t(id);
    uint32_t s = map_.entry(f).state.load();
    if (state_of(s) != kNone) continue;  // here, under way, or no room
    int home = opt_.peers->home(f);
    if (home < 0) continue;           // re-homed here: a reader's request copies it
    if (opt_.peers->resting(home)) {  // no copy begun only to be given up: a later pass
      replicas_deferred_ = true;
      continue;
    }
    if (!set_state(f, s, make_state(kQueued, 0, coarse_now()))) continue;
    job = Job{.file = f, .peer = home, .replica = true};
    return true;
  }
  return false;
}

ssize_t Copier::read_peer(Job& job, char* buf, size_t len, Outcome& fallback) {
  // The peer answers "pending" while its own copy from the PFS moves, and
  // "unavailable" once it stops moving (its stall timeout): this copy's
  // readers wait as long as the peer's copy moves, like readers of the PFS
  // copy there. kPeerPatienceNs bounds it whatever the peer says.
  constexpr uint64_t kPeerPatienceNs = 30'000'000'000;
  uint64_t start = monotonic_ns();
  CopySlot& slot = map_.header().copies[job.slot];
  while (!stopping_) {
    size_t n = 0;
    // A replica a reader has asked for meanwhile is the reader's copy now.
    if (job.replica && boost_[job.slot]) job.replica = false, job.urgent = true;
    PeerSource::Got got = opt_.peers->read(job.peer, job.file, job.done, buf, len, job.replica, n);
    if (got == PeerSource::Got::kBytes && n > 0) {
      count(s_peer_bytes, n);
      return ssize_t(n);
    }
    if (got == PeerSource::Got::kBytes) got = PeerSource::Got::kUnavailable;  // short: the PFS
    if (got != PeerSource::Got::kPending || monotonic_ns() - start > kPeerPatienceNs) {
      if (job.replica) {  // never from the PFS: left for a later pass or a reader
        std::lock_guard lock(mu_);
        replicas_deferred_ |= got == PeerSource::Got::kNotYet;
        fallback = Outcome::kNotNow;
        return -2;
      }
      break;
    }
    slot.progress_ns.store(monotonic_ns(), std::memory_order_release);  // alive, as the peer's
  }
  fallback = Outcome::kFromPfs;
  return -2;
}

bool Copier::next_job(Job& job) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (stopping_) return false;
    std::deque<Job>* q = !urgent_.empty() ? &urgent_ : !paused_.empty() ? &paused_ : nullptr;
    if (q) {
      job = q->front();
      q->pop_front();
      if (q == &urgent_ && job.memfd >= 0) held_--;
      running_++;
      return true;
    }
    bool waiting_for_readers = false;
    if (opt_.stage_ahead && !map_.header().copies_off.load(std::memory_order_relaxed)) {
      for (int64_t id; (id = backlog_.current()) >= 0;) {
        uint32_t f = uint32_t(id);
        uint32_t s = map_.entry(f).state.load();
        if (state_of(s) == kNone && !window_room(map_.entry(f).size)) {
          waiting_for_readers = true;  // far enough ahead: until readers read some of it
          break;
        }
        backlog_.advance();
        if (state_of(s) == kNone && set_state(f, s, make_state(kQueued, 0, coarse_now()))) {
          job = Job{.file = f, .ahead = true};
          ahead_bytes_ += map_.entry(f).size;
          running_++;
          return true;
        }
      }
      if (rescan_) {
        rescan_ = false;
        backlog_.rewind();
        continue;
      }
    }
    rescan_ = false;
    // Nothing to copy until readers read or ask: the thread's buffer goes back
    // to the system, for the page cache of the job's readers (a block a thread).
    t_buffer.release();
    if (waiting_for_readers)
      cv_.wait_for(lock, std::chrono::milliseconds(50));  // readers do not call: look again
    else
      cv_.wait(lock);
  }
}

bool Copier::window_room(uint64_t size) const {
  const Header& h = map_.header();
  uint64_t shown =
      window_grows_ ? asked_bytes_ + h.ahead_opened.load(std::memory_order_relaxed) : 0;
  return ahead_room(opt_.ahead_window, ahead_bytes_,
                    h.ahead_touched.load(std::memory_order_relaxed), shown, size);
}

std::string Copier::tmp_name(uint32_t file) const {
  char name[64];
  return partial_name(map_, file, name, sizeof name) ? name : "";
}

void Copier::run(Job& job) {
  if (job.slot < 0 && !begin(job)) return;
  for (;;) {
    Outcome o = copy_blocks(job);
    if (o == Outcome::kDone) return finish(job);
    if (o == Outcome::kPaused) {
      std::lock_guard lock(mu_);
      paused_.push_back(job);
      return;
    }
    if (o == Outcome::kNotNow) return;
    if (o == Outcome::kFromPfs) {  // the peer cannot serve it: this node reads the PFS
      count(s_peer_fallbacks);
      std::lock_guard lock(mu_);
      job.peer = -1;
      urgent_.push_back(job);
      cv_.notify_all();
      return;
    }
    if (!begin(job)) return;  // kRetryNextTier
  }
}

bool Copier::begin(Job& job) {
  Entry& e = map_.entry(job.file);
  uint32_t from = e.state.load();
  FileState expect = job.memfd >= 0 ? kClaimed : kQueued;
  if (state_of(from) != expect) {  // released, or marked stale meanwhile
    if (job.memfd >= 0) close(job.memfd), job.memfd = -1;
    unahead(job);
    count(s_ignored);
    return false;
  }
  // A multi-node job's node keeps room for the files homed on it (its share
  // of the job's cache) before it holds copies of other nodes' files.
  bool home = !opt_.peers || opt_.peers->home(job.file) < 0;
  job.tier = placement_.reserve(e.size, home ? 0 : home_left_.load() + home_slack_);
  if (home && opt_.peers && !job.placed_home) {
    job.placed_home = true;
    uint64_t left = home_left_.load();
    while (!home_left_.compare_exchange_weak(left, left - std::min(left, e.size))) {
    }
  }
  // The buffer before the PFS file is opened: without memory the job waits
  // in the paused queue, its file still queued (readers' waits stay bounded
  // by the stall timeout), never failed for good, which would send every
  // reader of it to the PFS and let stage-ahead open the whole backlog.
  if (uint64_t block = job.tier >= 0 ? opt_.block_sizes[job.tier] : 0;
      block && job.memfd < 0 && !copy_buffer(block)) {
    placement_.release(job.tier, e.size);
    job.tier = -1;
    no_buffer(job, block);
    return false;
  }
  if (job.tier < 0) {
    if (home && opt_.peers)
      spdlog::debug("no room for {} ({} bytes), a file homed here", map_.path(job.file), e.size);
    count(s_noroom);
    set_state(job.file, from, make_state(kNoRoom));
    unahead(job);
    close_files(job, false);
    return false;
  }
  {
    std::lock_guard lock(mu_);
    job.slot = free_slots_.back();
    free_slots_.pop_back();
  }
  CopySlot& slot = map_.header().copies[job.slot];
  slot.progress.store(0);
  slot.quiet_ms.store(0);
  slot.progress_ns.store(monotonic_ns());
  slot.file.store(job.file + 1);
  boost_[job.slot] = job.urgent;
  job.done = 0;
  job.started_ns = monotonic_ns();

  job.rel = std::string(map_.path(job.file));  // one read: published under the name opened
  const std::string& rel = job.rel;
  if (!clean_rel(rel)) {
    count_copy_error(counters_, 0);
    abandon(job, kFailed);
    return false;
  }
  // A peer's copy was checked against the same index by the peer: the PFS
  // file is not opened here, which spares its metadata server N opens a file.
  if (job.memfd < 0 && job.peer < 0) {
    uint64_t t0 = monotonic_ns();
    job.src = openat(opt_.root_fd, rel.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    job.open_ns = monotonic_ns() - t0;
    count(s_pfs_opens);
    count(s_pfs_open_ns, job.open_ns);
    struct stat st;
    if (job.src < 0 || fstat(job.src, &st) != 0) {
      int err = errno;
      spdlog::info("cannot read {}: {}; it will be read from the PFS", rel, std::strerror(err));
      count_copy_error(counters_, err);
      abandon(job, kFailed);
      return false;
    }
    // The copy is made only from the version the index holds (device, inode,
    // size, mtime, ctime): readers move to it only when they opened that version.
    if (!map_.same_version(job.file, st)) {
      count(s_stale);
      abandon(job, kStale);
      return false;
    }
  }
  std::string tmp = tmp_name(job.file);
  job.dst = openat(opt_.tier_fds[job.tier], tmp.c_str(),
                   O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (job.dst < 0) {
    int err = errno;
    spdlog::warn("cannot create {} on tier {}: {}", tmp, job.tier, std::strerror(err));
    if (no_space(err)) {
      placement_.mark_full(job.tier);
      count(s_tier_full);
      abandon(job, expect);
      return begin(job);
    }
    count_copy_error(counters_, err);
    abandon(job, kFailed);
    return false;
  }
  job.copying = make_state(kCopying, job.tier, job.slot);
  if (!set_state(job.file, from, job.copying)) {  // a writer marked it stale meanwhile
    abandon(job, kStale);
    return false;
  }
  return true;
}

Copier::Outcome Copier::copy_blocks(Job& job) {
  const Entry& e = map_.entry(job.file);
  uint64_t block = opt_.block_sizes[job.tier];
  char* buf = job.memfd < 0 ? copy_buffer(block) : nullptr;
  if (job.memfd < 0 && !buf) {  // a paused copy whose buffer went back: paused again
    note_no_buffer(block);
    return Outcome::kPaused;
  }
  CopySlot& slot = map_.header().copies[job.slot];
  for (;;) {
    if (stopping_) {
      abandon(job, kNone);
      return Outcome::kDone;
    }
    ssize_t n;
    if (job.memfd >= 0) {
      off_t off = off_t(job.done);
      n = sendfile(job.dst, job.memfd, &off, e.size - job.done);
      if (n == 0 && job.done < e.size) errno = EIO, n = -1;  // the memfd was short
    } else {
      if (job.peer >= 0) {
        Outcome fallback = Outcome::kDone;
        n = read_peer(job, buf, std::min<uint64_t>(block, e.size - job.done), fallback);
        if (n == -2) {
          abandon(job, fallback == Outcome::kNotNow ? kNone : kQueued);
          return fallback;
        }
      } else {
        // At most a byte past the indexed size (a file that grew returns it,
        // and finish() finds its copy too long): a direct-I/O read takes the
        // pages of all the buffer it is given, 4 MiB a thread for files of a
        // few KiB (on FUSE, 1 MiB a request).
        uint64_t want = std::min<uint64_t>(block, e.size - job.done + 1);
        slot.quiet_ms.store(uint32_t(want / kSlowestReadBytesPerMs), std::memory_order_relaxed);
        uint64_t t0 = monotonic_ns();
        n = pread(job.src, buf, want, off_t(job.done));
        if (n > 0) {
          uint64_t ns = monotonic_ns() - t0;
          count(s_pfs_reads);
          count(s_pfs_bytes, n);
          count(s_pfs_read_ns, ns);
          if (job.done == 0) job.first_read_ns = ns, job.first_read_bytes = uint64_t(n);
        }
      }
      if (n > 0) {
        for (ssize_t w = 0; w < n;) {
          ssize_t k = write(job.dst, buf + w, n - w);
          if (k < 0 && errno == EINTR) continue;
          if (k < 0) {
            n = -1;
            break;
          }
          w += k;
        }
      }
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      if (no_space(err)) {
        spdlog::warn("tier {} is full ({}); placing nothing more there", job.tier,
                     std::strerror(err));
        placement_.mark_full(job.tier);
        count(s_tier_full);
        abandon(job, job.memfd >= 0 ? kClaimed : kQueued);
        return Outcome::kRetryNextTier;
      }
      spdlog::warn("copy of {} failed: {}; it will be read from the PFS", map_.path(job.file),
                   std::strerror(err));
      count_copy_error(counters_, err);
      abandon(job, kFailed);
      return Outcome::kDone;
    }
    if (n == 0) break;  // end of file; finish() checks the size
    job.done += n;
    slot.progress.store(job.done, std::memory_order_release);
    uint64_t now = monotonic_ns();
    slot.progress_ns.store(now, std::memory_order_release);
    map_.header().copied_ns.store(now, std::memory_order_relaxed);
    // At the indexed size: no read to find the end of the file (a PFS round
    // trip per file); finish() checks the PFS file still has that size.
    if (job.done >= e.size) break;
    if (!job.urgent && !boost_[job.slot]) {
      std::lock_guard lock(mu_);
      if (!urgent_.empty()) {
        count(s_preemptions);
        return Outcome::kPaused;
      }
    }
  }
  return Outcome::kDone;
}

void Copier::finish(Job& job) {
  if (job.slot < 0) return;  // abandoned in copy_blocks
  Entry& e = map_.entry(job.file);
  struct stat st;
  if (job.done != e.size || (job.memfd < 0 && job.peer < 0 &&
                             (fstat(job.src, &st) != 0 || !map_.same_version(job.file, st)))) {
    count(s_stale);
    return abandon(job, kStale);
  }
  timespec times[2] = {{e.atime_ns / 1'000'000'000, e.atime_ns % 1'000'000'000},
                       {e.mtime_ns / 1'000'000'000, e.mtime_ns % 1'000'000'000}};
  futimens(job.dst, times);  // the copy carries the version it was made from
  // Start writing the copy back now, while the job still reads the PFS, so that
  // its dirty pages are not flushed during the next epoch's local reads.
  sync_file_range(job.dst, 0, 0, SYNC_FILE_RANGE_WRITE);
  const std::string& rel = job.rel;
  std::string tmp = tmp_name(job.file), final_name = std::string(kDataDir) + "/" + rel;
  int tier_fd = opt_.tier_fds[job.tier];
  int closed = close(job.dst), err = errno;
  job.dst = -1;
  if (closed != 0) {  // a copy whose last bytes may not be on disk is never published
    spdlog::warn("copy of {} failed at close: {}; it will be read from the PFS", rel,
                 std::strerror(err));
    if (no_space(err)) {
      placement_.mark_full(job.tier);
      count(s_tier_full);
      return abandon(job, kNone);
    }
    count_copy_error(counters_, err);
    return abandon(job, kFailed);
  }
  // The final name is linked before the state word says "cached", and the
  // temporary name unlinked only after: a reader the word sent to either name
  // finds the file there. (A rename left a moment in which the word still
  // said "copying" and the temporary name was gone: under CPU load readers
  // read the PFS in that moment, a second time.) A tier without hard links,
  // or a name already there, is published by rename as before. The folders
  // are made only when the name cannot be made for want of them (ENOENT): no
  // syscall more for a file whose folder is there, and a folder the job
  // removed is made again.
  bool linked = false;
  auto publish = [&] {
    linked = linkat(tier_fd, tmp.c_str(), tier_fd, final_name.c_str(), 0) == 0;
    return linked || renameat(tier_fd, tmp.c_str(), tier_fd, final_name.c_str()) == 0;
  };
  if (!publish() && (errno != ENOENT || !make_parents(tier_fd, final_name) || !publish())) {
    int err = errno;
    spdlog::warn("cannot publish {} on tier {}: {}", rel, job.tier, std::strerror(err));
    count_copy_error(counters_, err);
    return abandon(job, kFailed);
  }
  placement_.written(job.tier, e.size);
  // Made ahead of any reader: readers mark it when they open it (kTouched).
  bool ahead = job.memfd < 0 && !job.urgent && !boost_[job.slot];
  if (!ahead && job.ahead) {
    std::lock_guard lock(mu_);
    ahead_bytes_ -= std::min<uint64_t>(ahead_bytes_, e.size);  // a reader asked meanwhile
    asked(job.file);
    job.ahead = false;
  }
  bool published =
      set_state(job.file, job.copying, make_state(kCached, job.tier, ahead ? kAhead : 0));
  if (linked) unlinkat(tier_fd, tmp.c_str(), 0);
  if (published) map_.header().copies_changed.fetch_add(1, std::memory_order_release);
  if (!published) {
    // Marked stale while it was written: the copy goes, the PFS serves.
    unlinkat(tier_fd, final_name.c_str(), 0);
    placement_.release(job.tier, e.size);
    count(s_stale);
    job.tier = -1;
    return close_files(job, false);
  }
  if (job.memfd >= 0) {
    count(s_handoffs);
    count(s_handoff_bytes, e.size);
  } else if (job.peer >= 0) {
    count(s_peer_copies);
  } else {
    count(s_copies);
    count(s_copy_bytes, e.size);
  }
  count(s_copy_ns, monotonic_ns() - job.started_ns);
  last_copy_ns_ = monotonic_ns();
  if (job.first_read_bytes && sampling_.load(std::memory_order_relaxed))
    sample_tier(job, final_name);
  judge_the_pfs();
  job.tier = -1;
  close_files(job, false);
}

void Copier::abandon(Job& job, FileState state) {
  if (state != kQueued) unahead(job);  // no copy ahead after all
  if (job.dst >= 0 || job.slot >= 0) {
    std::string tmp = tmp_name(job.file);
    if (job.tier >= 0) unlinkat(opt_.tier_fds[job.tier], tmp.c_str(), 0);
  }
  if (job.tier >= 0) placement_.release(job.tier, map_.entry(job.file).size);
  job.tier = -1;
  // Only from the state this job put the file in: a reader's kStale mark wins.
  uint32_t w = map_.entry(job.file).state.load();
  FileState cur = state_of(w);
  bool ours = job.copying ? w == job.copying : (cur == kQueued || cur == kClaimed);
  uint32_t aux = (state == kQueued || state == kClaimed) ? coarse_now() : 0;
  if (ours) set_state(job.file, w, make_state(state, 0, aux));
  job.copying = 0;
  // A retry on the next tier keeps a reader's bytes.
  close_files(job, state == kQueued || state == kClaimed);
}

void Copier::close_files(Job& job, bool keep_memfd) {
  if (job.src >= 0) close(job.src);
  if (job.dst >= 0) close(job.dst);
  job.src = job.dst = -1;
  if (job.slot >= 0) {
    map_.header().copies[job.slot].file.store(0);
    boost_[job.slot] = false;
    std::lock_guard lock(mu_);
    free_slots_.push_back(job.slot);
  }
  job.slot = -1;
  if (!keep_memfd && job.memfd >= 0) close(job.memfd), job.memfd = -1;
}

bool Copier::make_parents(int dir_fd, std::string_view name) {
  for (size_t slash = name.find('/'); slash != std::string_view::npos;
       slash = name.find('/', slash + 1))
    if (mkdirat(dir_fd, std::string(name.substr(0, slash)).c_str(), 0700) != 0 && errno != EEXIST)
      return false;
  return true;
}

}  // namespace monarch
