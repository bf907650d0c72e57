#include "stats.h"

#include <sys/time.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <sstream>

namespace monarch {
namespace {

// The time series starts at 100 ms per sample, so that a 5-second job shows
// its 0.2-second epochs; past kMaxSamples it is halved in resolution (a
// 10-hour job ends with 12.8-s samples), which bounds the statistics' size.
constexpr uint64_t kFirstIntervalMs = 100;
constexpr size_t kMaxSamples = 3600;
// The cached bytes scan the whole map: every sample for up to kCachedScanFiles
// files (a few hundred microseconds), else once a second.
constexpr uint64_t kCachedScanFiles = 100'000, kCachedEveryMs = 1000;
// A group of counters is written as one per tier or one per bucket by its size.
static_assert(kPassBuckets != kMapTiers);

struct CounterName {
  const char* name;
  int first, count;
};
constexpr CounterName kProcessNames[] = {
#define MONARCH_COUNTER_NAME(name, n, meaning) {#name, c_##name, n},
    MONARCH_PROCESS_COUNTERS(MONARCH_COUNTER_NAME)
#undef MONARCH_COUNTER_NAME
};
constexpr const char* kStagerNames[] = {
#define MONARCH_STAGER_NAME(name, meaning) #name,
    MONARCH_STAGER_COUNTERS(MONARCH_STAGER_NAME)
#undef MONARCH_STAGER_NAME
};

int64_t unix_now() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  return tv.tv_sec;
}

// The length of the valid UTF-8 sequence at s[i] (RFC 3629: no overlong
// form, no surrogate, at most U+10FFFF), 0 when none starts there.
size_t utf8_length(std::string_view s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n = c >= 0xc2 && c <= 0xdf   ? 2
             : c >= 0xe0 && c <= 0xef ? 3
             : c >= 0xf0 && c <= 0xf4 ? 4
                                      : 0;
  if (n == 0 || n > s.size() - i) return 0;
  uint32_t cp = c & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) {
    auto d = static_cast<unsigned char>(s[i + k]);
    if ((d & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (d & 0x3f);
  }
  if (n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) return 0;
  if (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) return 0;
  return n;
}

}  // namespace

std::string as_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (size_t n = utf8_length(s, i)) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(s[i++]));
    out += buf;
  }
  return out;
}

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : as_utf8(s)) {
    if (c == '"' || c == '\\')
      out += '\\', out += char(c);
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else
      out += char(c);
  }
  return out + "\"";
}

Stats::Stats(const JobMap& map, const std::atomic<uint64_t>* stager, const Placement& placement,
             JobInfo info, IndexStats index)
    : map_(map),
      stager_(stager),
      placement_(placement),
      info_(std::move(info)),
      index_(index),
      start_ns_(monotonic_ns()),
      interval_ms_(kFirstIntervalMs) {
  last_ = poll_ = rate_from_ = take(start_ns_);
  pass_opens_from_.t_ns = start_ns_;  // the first pass: from nothing
  for (uint64_t i = 0; i < map_.size(); ++i) {
    bucket_files_[i % kPassBuckets]++;
    bucket_bytes_[i % kPassBuckets] += map_.entry(i).size;
  }
}

double Stats::opened_share(const Snapshot& from, const Snapshot& to) const {
  uint64_t size = map_.header().dataset_bytes;
  if (size == 0) return 0;
  double covered = 0;
  for (int b = 0; b < kPassBuckets; ++b) {
    uint64_t opens = to.p[c_pass_opens + b] - from.p[c_pass_opens + b];
    if (bucket_files_[b] > 0)
      covered += double(bucket_bytes_[b]) * std::min(1.0, double(opens) / double(bucket_files_[b]));
  }
  return covered / double(size);
}

Stats::Snapshot Stats::take(uint64_t now_ns) const {
  Snapshot s;
  s.t_ns = now_ns;
  uint32_t used = std::min<uint32_t>(map_.header().next_slot.load(), kProcSlots);
  for (uint32_t i = 0; i < used; ++i) {
    const ProcSlot& slot = map_.slot(i);
    for (int c = 0; c < kNumCounters; ++c) s.p[c] += slot.c[c].load(std::memory_order_relaxed);
  }
  for (int c = 0; c < kNumStagerCounters; ++c) s.s[c] = stager_[c].load(std::memory_order_relaxed);
  s.p[c_reads] = s.p[c_mem_reads] + s.p[c_peer_served_reads] + s.p[c_pfs_served_reads];
  s.p[c_bytes] = s.p[c_mem_bytes] + s.p[c_peer_served_bytes] + s.p[c_pfs_served_bytes];
  for (int t = 0; t < kMapTiers; ++t) {
    s.p[c_reads] += s.p[c_tier_reads + t];
    s.p[c_bytes] += s.p[c_tier_bytes + t];
  }
  return s;
}

uint64_t Stats::tick(uint64_t now_ns) {
  constexpr uint64_t kSlow = 100'000'000, kFast = 1'000'000;
  uint64_t size = map_.header().dataset_bytes;
  if (size == 0) return kSlow;
  Snapshot s = take(now_ns);
  std::lock_guard lock(mu_);
  Snapshot a = poll_;
  poll_ = s;
  Snapshot zero;
  for (;;) {
    const Snapshot& from = epochs_.empty() ? zero : epochs_.back();
    uint64_t need = from.p[c_bytes] + size;
    if (s.p[c_bytes] < need || opened_share(pass_opens_from_, s) < kPassCover) break;
    Snapshot e = s;
    bool interpolated = a.p[c_bytes] < need;
    if (interpolated) {
      // The bytes came between the last poll and this one: interpolate by
      // bytes (the opens, if they came later, came before this poll too).
      double f = double(need - a.p[c_bytes]) / double(s.p[c_bytes] - a.p[c_bytes]);
      e.t_ns = a.t_ns + uint64_t(f * double(s.t_ns - a.t_ns));
      for (int c = 0; c < kNumCounters; ++c)
        e.p[c] = a.p[c] + uint64_t(f * double(s.p[c] - a.p[c]) + 0.5);
      for (int c = 0; c < kNumStagerCounters; ++c)
        e.s[c] = a.s[c] + uint64_t(f * double(s.s[c] - a.s[c]) + 0.5);
      e.p[c_bytes] = need;  // exact, whatever the rounding of its parts
    }
    epochs_.push_back(e);
    // The next pass's opens count from the last poll before its start: which
    // of the opens between two polls came after the boundary is unknown (an
    // interpolated share of each bucket would drop a fast job's files), so
    // the next pass may count a poll's worth of opens of this one.
    pass_opens_from_ = interpolated ? a : e;
    a = e;
  }
  uint64_t s_bytes = s.p[c_bytes];
  if (s.t_ns - rate_from_.t_ns >= kSlow / 2) {  // a rate over 1 ms would often be 0
    per_ns_ = double(s_bytes - rate_from_.p[c_bytes]) / double(s.t_ns - rate_from_.t_ns);
    rate_from_ = s;
  }
  uint64_t need = (epochs_.empty() ? 0 : epochs_.back().p[c_bytes]) + size;
  if (s_bytes >= need) return kSlow;  // the opens are short: a pass ends at a poll
  uint64_t left = need - s_bytes;
  return left <= size / 10 || double(left) <= per_ns_ * 3 * kSlow ? kFast : kSlow;
}

void Stats::note_first_attached() const {
  if (first_.first_pid != 0) return;
  const Header& h = map_.header();
  int32_t pid = h.first_attached_pid.load(std::memory_order_acquire);
  if (pid <= 0) return;  // none yet
  uint64_t ns = h.first_attached_ns.load(std::memory_order_relaxed);
  first_.first_pid = pid;
  first_.first_s = ns > start_ns_ ? double(ns - start_ns_) / 1e9 : 0;
  first_.first_command.assign(h.first_attached_comm,
                              strnlen(h.first_attached_comm, sizeof h.first_attached_comm));
}

Stats::Cached Stats::complete_copies() const {
  Cached c;
  for (uint64_t i = 0; i < map_.size(); ++i) {
    uint32_t w = map_.entry(i).state.load(std::memory_order_relaxed);
    if (state_of(w) != kCached || tier_of(w) >= kMapTiers) continue;
    c.files++;
    c.bytes += map_.entry(i).size;
    c.by_tier[tier_of(w)] += map_.entry(i).size;
  }
  return c;
}

Stats::Attached Stats::attached() const {
  std::lock_guard lock(mu_);
  note_first_attached();
  Attached a = first_;
  a.processes = map_.header().attached.load(std::memory_order_relaxed);
  return a;
}

void Stats::sample(uint64_t now_ns) {
  std::lock_guard lock(mu_);
  note_first_attached();
  uint64_t elapsed_ms = (now_ns - start_ns_) / 1'000'000;
  size_t ended = elapsed_ms / interval_ms_;  // intervals that have ended by now
  if (ended <= served_.size()) return;       // the current one is still open
  Snapshot s = take(now_ns);
  std::array<uint64_t, kMapTiers + 2> served{};
  for (int t = 0; t < kMapTiers; ++t) served[t] = s.p[c_tier_bytes + t] - last_.p[c_tier_bytes + t];
  served[kMapTiers] = s.p[c_pfs_served_bytes] + s.p[c_mem_bytes] - last_.p[c_pfs_served_bytes] -
                      last_.p[c_mem_bytes];
  served[kMapTiers + 1] = s.s[s_pfs_bytes] - last_.s[s_pfs_bytes];
  if (map_.size() <= kCachedScanFiles || served_.empty() ||
      elapsed_ms >= cached_ms_ + kCachedEveryMs) {
    cached_now_ = complete_copies().by_tier;
    cached_ms_ = elapsed_ms;
  }
  last_ = s;
  // A long pause (a stopped stager) can end many intervals at once: coarsen
  // first, so that the series stays under kMaxSamples.
  while (ended >= kMaxSamples) {
    halve();
    ended = elapsed_ms / interval_ms_;
  }
  // Intervals no sample closed (a late beat) stay empty: every sample keeps
  // its place on the time axis, and what they saw goes to the last one.
  while (served_.size() + 1 < ended) {
    served_.push_back({});
    cached_.push_back(cached_.empty() ? cached_now_ : cached_.back());
  }
  served_.push_back(served);
  cached_.push_back(cached_now_);
  if (served_.size() >= kMaxSamples) halve();
}

void Stats::halve() {
  // Sample i of the new series covers old samples 2i and 2i + 1; an odd last
  // one keeps its place alone.
  size_t n = (served_.size() + 1) / 2;
  for (size_t i = 0; i < n; ++i) {
    served_[i] = served_[2 * i];
    cached_[i] = cached_[2 * i];
    if (2 * i + 1 < served_.size()) {
      for (int k = 0; k < kMapTiers + 2; ++k) served_[i][k] += served_[2 * i + 1][k];
      cached_[i] = cached_[2 * i + 1];
    }
  }
  served_.resize(n);
  cached_.resize(n);
  interval_ms_ *= 2;
}

std::string Stats::json(bool complete, double fill_seconds) const {
  uint64_t now = monotonic_ns();
  Snapshot s = take(now);
  std::lock_guard lock(mu_);
  int tiers = placement_.tiers();
  std::ostringstream o;
  auto counters = [&](const Snapshot& a, const Snapshot* b) {
    o << "{";
    bool first = true;
    for (const CounterName& n : kProcessNames) {
      o << (first ? "" : ",") << json_string(n.name) << ":";
      first = false;
      auto v = [&](int c) { return a.p[c] - (b ? b->p[c] : 0); };
      if (n.count == 1) {
        o << v(n.first);
        continue;
      }
      o << "[";
      int k = n.count == kMapTiers ? tiers : n.count;  // per tier, or per bucket
      for (int t = 0; t < k; ++t) o << (t ? "," : "") << v(n.first + t);
      o << "]";
    }
    o << ",\"stager\":{";
    for (int c = 0; c < kNumStagerCounters; ++c)
      o << (c ? "," : "") << json_string(kStagerNames[c]) << ":" << a.s[c] - (b ? b->s[c] : 0);
    o << "}}";
  };

  o << "{\"schema\":" << json_string(kStatsSchema)
    << ",\"complete\":" << (complete ? "true" : "false") << ",\"job\":" << json_string(info_.job)
    << ",\"host\":" << json_string(info_.host) << ",\"user\":" << json_string(info_.user)
    << ",\"dataset\":" << json_string(info_.dataset)
    << ",\"config_file\":" << json_string(info_.config_file)
    << ",\"started_unix\":" << info_.started_unix << ",\"updated_unix\":" << unix_now()
    << ",\"elapsed_s\":" << (now - start_ns_) / 1e9;
  o << ",\"settings\":{\"consistency\":" << json_string(info_.consistency)
    << ",\"copy_threads\":" << info_.copy_threads
    << ",\"stage_ahead\":" << (info_.stage_ahead ? "true" : "false")
    << ",\"small_file_max\":" << info_.small_file_max << "}";
  o << ",\"tiers\":[";
  for (int t = 0; t < tiers; ++t) {
    o << (t ? "," : "") << "{\"name\":" << json_string(info_.tier_names[t])
      << ",\"dir\":" << json_string(info_.tier_dirs[t]) << ",\"quota\":" << placement_.quota(t)
      << ",\"used\":" << placement_.used(t)
      << ",\"full\":" << (placement_.full(t) ? "true" : "false") << "}";
  }
  Cached cached = complete_copies();
  o << "],\"index\":{\"files\":" << index_.files << ",\"bytes\":" << index_.bytes
    << ",\"dirs\":" << index_.dirs << ",\"skipped\":" << index_.skipped
    << ",\"unreadable_dirs\":" << index_.unreadable
    << ",\"metadata_calls\":" << index_.metadata_calls << ",\"seconds\":" << index_.seconds
    << ",\"stopped\":" << (index_.stopped ? 1 : 0) << ",\"map_bytes\":" << map_.header().file_size
    << "}";
  note_first_attached();
  o << ",\"attached\":{\"processes\":" << map_.header().attached.load(std::memory_order_relaxed)
    << ",\"first_pid\":" << first_.first_pid
    << ",\"first_command\":" << json_string(first_.first_command)
    << ",\"first_s\":" << first_.first_s << "}";
  o << ",\"cached\":{\"files\":" << cached.files << ",\"bytes\":" << cached.bytes
    << ",\"fill_seconds\":" << fill_seconds << "}";
  o << ",\"totals\":";
  counters(s, nullptr);
  o << ",\"epochs\":[";
  const Snapshot* prev = nullptr;
  Snapshot zero;
  zero.t_ns = start_ns_;
  for (size_t e = 0; e <= epochs_.size(); ++e) {
    const Snapshot& end = e < epochs_.size() ? epochs_[e] : s;
    const Snapshot& begin = prev ? *prev : zero;
    if (e == epochs_.size() && end.p[c_bytes] == begin.p[c_bytes]) break;  // no partial epoch
    o << (e ? "," : "") << "{\"number\":" << e + 1
      << ",\"complete\":" << (e < epochs_.size() ? "true" : "false")
      << ",\"start_s\":" << (begin.t_ns - start_ns_) / 1e9
      << ",\"end_s\":" << (end.t_ns - start_ns_) / 1e9 << ",\"counters\":";
    counters(end, &begin);
    o << "}";
    prev = &end;
  }
  o << "],\"series\":{\"interval_s\":" << interval_ms_ / 1e3 << ",\"served\":[";
  auto series = [&](const std::string& name, const char* kind, auto value) {
    o << "{\"name\":" << json_string(name) << ",\"kind\":\"" << kind << "\",\"bytes\":[";
    for (size_t i = 0; i < served_.size(); ++i) o << (i ? "," : "") << value(i);
    o << "]}";
  };
  for (int t = 0; t < tiers; ++t) {
    series(info_.tier_names[t], "tier", [&](size_t i) { return served_[i][t]; });
    o << ",";
  }
  series("pfs", "pfs", [&](size_t i) { return served_[i][kMapTiers]; });
  o << ",";
  series("stager", "copy", [&](size_t i) { return served_[i][kMapTiers + 1]; });
  o << "],\"cached\":[";
  for (int t = 0; t < tiers; ++t) {
    o << (t ? "," : "");
    series(info_.tier_names[t], "tier", [&](size_t i) { return cached_[i][t]; });
  }
  o << "]}}\n";
  return o.str();
}

}  // namespace monarch
