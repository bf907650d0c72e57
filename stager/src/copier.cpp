#include "copier.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_set>

namespace monarch {
namespace {

int64_t mtime_ns(const struct stat& st) {
  return int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

bool matches(const Entry& e, const struct stat& st) {
  return uint64_t(st.st_size) == e.size && mtime_ns(st) == e.mtime_ns;
}

bool no_space(int err) {
  return err == ENOSPC || err == EDQUOT;
}

}  // namespace

Copier::Copier(JobMap& map, Placement& placement, CopierOptions options,
               std::atomic<uint64_t>* counters)
    : map_(map), placement_(placement), opt_(std::move(options)), counters_(counters) {
  for (int s = kCopySlots - 1; s >= 0; --s) free_slots_.push_back(s);
  for (auto& b : boost_) b = false;
}

Copier::~Copier() {
  stop();
}

void Copier::start() {
  start_ns_ = monotonic_ns();
  // Smallest files first: when the dataset does not fit, the tiers then hold
  // the most files, which saves the most PFS operations in later epochs.
  backlog_.resize(map_.size());
  for (uint32_t i = 0; i < backlog_.size(); ++i) backlog_[i] = i;
  std::stable_sort(backlog_.begin(), backlog_.end(), [this](uint32_t a, uint32_t b) {
    return map_.entry(a).size < map_.entry(b).size;
  });
  for (unsigned i = 0; i < opt_.threads; ++i) threads_.emplace_back([this] { worker(); });
}

void Copier::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  std::deque<Job> paused, urgent;
  {
    std::lock_guard lock(mu_);
    paused.swap(paused_);
    urgent.swap(urgent_);
  }
  for (Job& j : paused) abandon(j, kNone);
  for (Job& j : urgent) {
    if (j.memfd >= 0) close(j.memfd);
    map_.entry(j.file).state.store(make_state(kNone));
  }
}

bool Copier::set_state(uint32_t file, uint32_t expect, uint32_t want) {
  return map_.entry(file).state.compare_exchange_strong(expect, want);
}

void Copier::place(uint32_t file) {
  if (file >= map_.size()) return count(s_ignored);
  uint32_t s = map_.entry(file).state.load();
  if (state_of(s) == kNone && set_state(file, s, make_state(kQueued))) {
    std::lock_guard lock(mu_);
    urgent_.push_back(Job{.file = file, .urgent = true});
    cv_.notify_one();
    return;
  }
  if (state_of(s) == kQueued || state_of(s) == kCopying) {
    std::lock_guard lock(mu_);
    if (state_of(s) == kCopying) boost_[aux_of(s)] = true;
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

void Copier::data(uint32_t file, int memfd) {
  if (file >= map_.size() || state_of(map_.entry(file).state.load()) != kClaimed) {
    close(memfd);
    return count(s_ignored);
  }
  std::lock_guard lock(mu_);
  urgent_.push_back(Job{.file = file, .urgent = true, .memfd = memfd});
  cv_.notify_one();
}

void Copier::stale(uint32_t file) {
  if (file >= map_.size()) return count(s_ignored);
  Entry& e = map_.entry(file);
  uint32_t s = e.state.load();
  if (state_of(s) == kCached && set_state(file, s, make_state(kStale))) {
    std::string name = "data/" + std::string(map_.path(file));
    unlinkat(opt_.tier_fds[tier_of(s)], name.c_str(), 0);
    placement_.release(tier_of(s), e.size);
    count(s_stale);
  } else if (state_of(s) == kNone || state_of(s) == kNoRoom) {
    if (set_state(file, s, make_state(kStale))) count(s_stale);
  }
  // kQueued, kCopying, kClaimed: the copy is checked against the PFS before it is published.
}

void Copier::rescan() {
  std::lock_guard lock(mu_);
  rescan_ = true;
  cv_.notify_one();
}

void Copier::reap_claims() {
  bool freed = false;
  for (uint64_t i = 0; i < map_.size(); ++i) {
    uint32_t s = map_.entry(i).state.load(std::memory_order_relaxed);
    if (state_of(s) != kClaimed) continue;
    if (kill(pid_t(aux_of(s)), 0) == 0 || errno != ESRCH) continue;
    freed |= set_state(uint32_t(i), s, make_state(kNone));
  }
  if (freed) rescan();
}

bool Copier::idle() const {
  std::lock_guard lock(mu_);
  return urgent_.empty() && paused_.empty() && running_ == 0 && !rescan_ &&
         (!opt_.stage_ahead || backlog_next_ >= map_.size());
}

double Copier::fill_seconds() const {
  uint64_t last = last_copy_ns_.load();
  return last ? (last - start_ns_) / 1e9 : 0;
}

void Copier::worker() {
  Job job;
  while (next_job(job)) {
    run(job);
    std::lock_guard lock(mu_);
    running_--;
  }
}

bool Copier::next_job(Job& job) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (stopping_) return false;
    std::deque<Job>* q = !urgent_.empty() ? &urgent_ : !paused_.empty() ? &paused_ : nullptr;
    if (q) {
      job = q->front();
      q->pop_front();
      running_++;
      return true;
    }
    if (opt_.stage_ahead) {
      while (backlog_next_ < map_.size()) {
        uint32_t f = backlog_[backlog_next_++];
        uint32_t s = map_.entry(f).state.load();
        if (state_of(s) == kNone && set_state(f, s, make_state(kQueued))) {
          job = Job{.file = f};
          running_++;
          return true;
        }
      }
      if (rescan_) {
        rescan_ = false;
        backlog_next_ = 0;
        continue;
      }
    }
    rescan_ = false;
    cv_.wait(lock);
  }
}

std::string Copier::tmp_name(uint32_t file) const {
  return "tmp/" + std::to_string(map_.header().generation) + "-" + std::to_string(file);
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
    if (!begin(job)) return;  // kRetryNextTier
  }
}

bool Copier::begin(Job& job) {
  Entry& e = map_.entry(job.file);
  uint32_t expect = e.state.load();
  FileState from = job.memfd >= 0 ? kClaimed : kQueued;
  if (state_of(expect) != from) {  // released, or marked stale meanwhile
    if (job.memfd >= 0) close(job.memfd), job.memfd = -1;
    count(s_ignored);
    return false;
  }
  job.tier = placement_.reserve(e.size);
  if (job.tier < 0) {
    count(s_noroom);
    abandon(job, kNoRoom);
    return false;
  }
  {
    std::lock_guard lock(mu_);
    job.slot = free_slots_.back();
    free_slots_.pop_back();
  }
  CopySlot& slot = map_.header().copies[job.slot];
  slot.progress.store(0);
  slot.file.store(job.file + 1);
  boost_[job.slot] = job.urgent;
  job.done = 0;
  job.started_ns = monotonic_ns();

  std::string rel(map_.path(job.file));
  if (job.memfd < 0) {
    job.src = openat(opt_.root_fd, rel.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    count(s_pfs_opens);
    struct stat st;
    if (job.src < 0 || fstat(job.src, &st) != 0) {
      spdlog::info("cannot read {}: {}; it will be read from the PFS", rel, std::strerror(errno));
      count(s_copy_errors);
      abandon(job, kFailed);
      return false;
    }
    if (!matches(e, st)) {
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
      abandon(job, kQueued);
      return begin(job);
    }
    count(s_copy_errors);
    abandon(job, kFailed);
    return false;
  }
  e.state.store(make_state(kCopying, job.tier, job.slot));
  return true;
}

Copier::Outcome Copier::copy_blocks(Job& job) {
  thread_local std::vector<char> buf;
  const Entry& e = map_.entry(job.file);
  uint64_t block = opt_.block_sizes[job.tier];
  if (buf.size() < block) buf.resize(block);
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
      uint64_t t0 = monotonic_ns();
      n = pread(job.src, buf.data(), block, off_t(job.done));
      if (n > 0) {
        count(s_pfs_reads);
        count(s_pfs_bytes, n);
        count(s_pfs_read_ns, monotonic_ns() - t0);
        for (ssize_t w = 0; w < n;) {
          ssize_t k = write(job.dst, buf.data() + w, n - w);
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
        abandon(job, kQueued);
        return Outcome::kRetryNextTier;
      }
      spdlog::warn("copy of {} failed: {}; it will be read from the PFS", map_.path(job.file),
                   std::strerror(err));
      count(s_copy_errors);
      abandon(job, kFailed);
      return Outcome::kDone;
    }
    if (n == 0) break;  // end of file; finish() checks the size
    job.done += n;
    slot.progress.store(job.done, std::memory_order_release);
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
  if (job.done != e.size || (job.memfd < 0 && (fstat(job.src, &st) != 0 || !matches(e, st)))) {
    count(s_stale);
    return abandon(job, kStale);
  }
  timespec times[2] = {{e.atime_ns / 1'000'000'000, e.atime_ns % 1'000'000'000},
                       {e.mtime_ns / 1'000'000'000, e.mtime_ns % 1'000'000'000}};
  futimens(job.dst, times);  // the copy carries the version it was made from
  // Start writing the copy back now, while the job still reads the PFS, so that
  // its dirty pages are not flushed during the next epoch's local reads.
  sync_file_range(job.dst, 0, 0, SYNC_FILE_RANGE_WRITE);
  std::string rel(map_.path(job.file));
  std::string tmp = tmp_name(job.file), final_name = "data/" + rel;
  int tier_fd = opt_.tier_fds[job.tier];
  if (close(job.dst) != 0 && no_space(errno)) {
    job.dst = -1;
    placement_.mark_full(job.tier);
    count(s_tier_full);
    return abandon(job, kNone);
  }
  job.dst = -1;
  if (!make_parents(job.tier, rel) || renameat(tier_fd, tmp.c_str(), tier_fd, final_name.c_str())) {
    spdlog::warn("cannot publish {} on tier {}: {}", rel, job.tier, std::strerror(errno));
    count(s_copy_errors);
    return abandon(job, kFailed);
  }
  placement_.written(job.tier, e.size);
  if (job.memfd >= 0) {
    count(s_handoffs);
    count(s_handoff_bytes, e.size);
  } else {
    count(s_copies);
    count(s_copy_bytes, e.size);
  }
  count(s_copy_ns, monotonic_ns() - job.started_ns);
  e.state.store(make_state(kCached, job.tier), std::memory_order_release);
  last_copy_ns_ = monotonic_ns();
  job.tier = -1;
  close_files(job, false);
}

void Copier::abandon(Job& job, FileState state) {
  if (job.dst >= 0 || job.slot >= 0) {
    std::string tmp = tmp_name(job.file);
    if (job.tier >= 0) unlinkat(opt_.tier_fds[job.tier], tmp.c_str(), 0);
  }
  if (job.tier >= 0) placement_.release(job.tier, map_.entry(job.file).size);
  job.tier = -1;
  // A retry on the next tier (kQueued) keeps a reader's bytes; a handed-over
  // file must then return to kClaimed for begin() to accept it again.
  bool retry = state == kQueued;
  FileState back = (retry && job.memfd >= 0) ? kClaimed : state;
  map_.entry(job.file).state.store(make_state(back));
  close_files(job, retry);
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

bool Copier::make_parents(int tier, std::string_view rel) {
  static std::mutex mu;
  static std::unordered_set<std::string> made;  // "tier/dir" already created
  for (size_t slash = rel.find('/'); slash != std::string_view::npos;
       slash = rel.find('/', slash + 1)) {
    std::string dir = "data/" + std::string(rel.substr(0, slash));
    std::string key = std::to_string(tier) + "/" + dir;
    {
      std::lock_guard lock(mu);
      if (made.count(key)) continue;
    }
    if (mkdirat(opt_.tier_fds[tier], dir.c_str(), 0700) != 0 && errno != EEXIST) return false;
    std::lock_guard lock(mu);
    made.insert(key);
  }
  return true;
}

}  // namespace monarch
