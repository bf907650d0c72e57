#include "jobmap.h"

#include <time.h>

#include <cstring>

namespace monarch {

JobMap::JobMap(void* base, size_t size) {
  auto* p = static_cast<char*>(base);
  h_ = reinterpret_cast<Header*>(p);
  if (size < sizeof(Header) || h_->file_size > size) return;
  entries_ = reinterpret_cast<Entry*>(p + h_->entries_off);
  strings_ = p + h_->strings_off;
  buckets_ = reinterpret_cast<const uint32_t*>(p + h_->buckets_off);
  attrs_ = reinterpret_cast<const Attr*>(p + h_->attrs_off);
  slots_ = reinterpret_cast<ProcSlot*>(p + h_->slots_off);
}

std::string_view JobMap::validate() const {
  if (!h_) return "not mapped";
  if (std::memcmp(h_->magic, kMagic, sizeof kMagic) != 0) return "not a Monarch index (bad magic)";
  if (!entries_) return "truncated";
  if (h_->tier_count > kMapTiers) return "bad tier count";
  return {};
}

uint64_t JobMap::hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h ^ (h >> 29);
}

int64_t JobMap::find(std::string_view rel) const {
  uint64_t n = h_->bucket_count;
  if (n == 0) return -1;
  for (uint64_t b = bucket_of(hash(rel), n);; b = b + 1 == n ? 0 : b + 1) {
    uint32_t v = buckets_[b];
    if (v == 0) return -1;
    if (path(v - 1) == rel) return v - 1;
  }
}

bool JobMap::stager_alive(uint64_t now_ns) const {
  uint64_t beat = h_->heartbeat_ns.load(std::memory_order_relaxed);
  return beat && !h_->stopping.load(std::memory_order_relaxed) && now_ns - beat < kHeartbeatFreshNs;
}

bool JobMap::fill_stat(uint32_t id, struct stat* st) const {
  const Attr* a = attr(id);
  if (!a) return false;
  const Entry& e = entries_[id];
  std::memset(st, 0, sizeof *st);
  st->st_dev = a->dev;
  st->st_ino = e.ino;
  st->st_mode = a->mode;
  st->st_nlink = a->nlink;
  st->st_uid = a->uid;
  st->st_gid = a->gid;
  st->st_size = static_cast<off_t>(e.size);
  st->st_blksize = a->blksize;
  st->st_blocks = e.blocks;
  st->st_atim = {e.atime_ns / 1'000'000'000, e.atime_ns % 1'000'000'000};
  st->st_mtim = {e.mtime_ns / 1'000'000'000, e.mtime_ns % 1'000'000'000};
  st->st_ctim = {e.ctime_ns / 1'000'000'000, e.ctime_ns % 1'000'000'000};
  return true;
}

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int normalize_path(std::string_view base, std::string_view path, char* out, size_t cap) {
  size_t n = 0;
  auto push = [&](std::string_view comp) {
    if (comp.empty() || comp == ".") return true;
    if (comp == "..") {
      while (n > 0 && out[n - 1] != '/') --n;  // drop the last component
      if (n > 0) --n;                          // and its slash; "/.." stays "/"
      return true;
    }
    if (n + 1 + comp.size() >= cap) return false;
    out[n++] = '/';
    std::memcpy(out + n, comp.data(), comp.size());
    n += comp.size();
    return true;
  };
  auto walk = [&](std::string_view s) {
    while (!s.empty()) {
      size_t slash = s.find('/');
      if (!push(s.substr(0, slash))) return false;
      if (slash == std::string_view::npos) break;
      s.remove_prefix(slash + 1);
    }
    return true;
  };
  if (cap < 2) return -1;
  if (path.empty() || path[0] != '/')
    if (!walk(base)) return -1;
  if (!walk(path)) return -1;
  if (n == 0) out[n++] = '/';
  if (path.size() > 1 && path.back() == '/' && out[n - 1] != '/') {
    if (n + 1 >= cap) return -1;
    out[n++] = '/';
  }
  out[n] = '\0';
  return static_cast<int>(n);
}

std::string_view under_root(std::string_view abs, std::string_view root) {
  if (root.empty() || abs.size() <= root.size() + 1) return {};
  if (abs.compare(0, root.size(), root) != 0 || abs[root.size()] != '/') return {};
  return abs.substr(root.size() + 1);
}

}  // namespace monarch
