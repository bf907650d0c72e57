#include "jobmap.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

namespace monarch {
namespace {

// Copies a NUL-terminated string of at most kPathMax - 1 bytes, or fails.
bool copy_string(char (&dst)[kPathMax], const char (&src)[kPathMax]) {
  size_t n = strnlen(src, kPathMax);
  if (n == kPathMax) return false;
  std::memcpy(dst, src, n + 1);
  return true;
}

// Does [off, off + count * size) lie inside a file of `total` bytes?
bool inside(uint64_t off, uint64_t count, uint64_t size, uint64_t total) {
  if (off > total || (size && count > (total - off) / size)) return false;
  return true;
}

}  // namespace

JobMap::JobMap(void* base, size_t size) {
  auto* p = static_cast<char*>(base);
  if (!p || size < sizeof(Header)) {
    why_ = "truncated";
    return;
  }
  h_ = reinterpret_cast<Header*>(p);
  // One read of each count and offset: a process scribbling on the map cannot
  // change them under us after they are checked.
  const Header& live = *h_;
  struct {
    uint64_t file_size, file_count, dir_count, strings_size, bucket_count, dir_bucket_count;
    uint64_t attr_count, entries_off, strings_off, buckets_off, attrs_off, dirs_off;
    uint64_t dir_buckets_off, slots_off, ino_buckets_off, ino_bucket_count;
    uint32_t tier_count;
  } h = {live.file_size,       live.file_count,       live.dir_count,       live.strings_size,
         live.bucket_count,    live.dir_bucket_count, live.attr_count,      live.entries_off,
         live.strings_off,     live.buckets_off,      live.attrs_off,       live.dirs_off,
         live.dir_buckets_off, live.slots_off,        live.ino_buckets_off, live.ino_bucket_count,
         live.tier_count};
  if (std::memcmp(live.magic, kMagic, sizeof kMagic) != 0) {
    why_ = "not a Monarch index of this version (bad magic)";
    return;
  }
  uint64_t total = h.file_size;
  if (total > size || total < sizeof(Header)) {
    why_ = "truncated";
    return;
  }
  bool ok = h.file_count < 0xfffffff0u && h.dir_count < 0xfffffff0u && h.tier_count <= kMapTiers &&
            h.attr_count <= kNoAttr && inside(h.entries_off, h.file_count, sizeof(Entry), total) &&
            inside(h.strings_off, h.strings_size, 1, total) &&
            inside(h.buckets_off, h.bucket_count, sizeof(uint32_t), total) &&
            inside(h.attrs_off, h.attr_count, sizeof(Attr), total) &&
            inside(h.dirs_off, h.dir_count, sizeof(DirEntry), total) &&
            inside(h.dir_buckets_off, h.dir_bucket_count, sizeof(uint32_t), total) &&
            inside(h.slots_off, kProcSlots, sizeof(ProcSlot), total) &&
            inside(h.ino_buckets_off, h.ino_bucket_count, sizeof(uint32_t), total) &&
            h.ino_buckets_off % 4 == 0 &&
            (h.file_count == 0 || h.ino_bucket_count > h.file_count) &&
            h.entries_off % alignof(Entry) == 0 && h.dirs_off % alignof(DirEntry) == 0 &&
            h.slots_off % alignof(ProcSlot) == 0 && h.attrs_off % alignof(Attr) == 0 &&
            h.buckets_off % 4 == 0 && h.dir_buckets_off % 4 == 0 &&
            (h.file_count == 0 || h.bucket_count > h.file_count) &&
            (h.dir_count == 0 || h.dir_bucket_count > h.dir_count) &&
            copy_string(root_, live.root) && copy_string(real_root_, live.real_root);
  for (uint32_t t = 0; ok && t < h.tier_count; ++t) {
    ok = copy_string(tier_dirs_[t], live.tier_dirs[t]);
    tier_dev_[t] = live.tier_dev[t];
    tier_ino_[t] = live.tier_ino[t];
  }
  if (!ok) {
    why_ = "damaged header";
    return;
  }
  entries_ = reinterpret_cast<Entry*>(p + h.entries_off);
  dir_entries_ = reinterpret_cast<DirEntry*>(p + h.dirs_off);
  strings_ = p + h.strings_off;
  buckets_ = reinterpret_cast<const uint32_t*>(p + h.buckets_off);
  dir_buckets_ = reinterpret_cast<const uint32_t*>(p + h.dir_buckets_off);
  attrs_ = reinterpret_cast<const Attr*>(p + h.attrs_off);
  slots_ = reinterpret_cast<ProcSlot*>(p + h.slots_off);
  files_ = h.file_count;
  dirs_ = h.dir_count;
  strings_size_ = h.strings_size;
  bucket_count_ = h.bucket_count;
  dir_bucket_count_ = h.dir_bucket_count;
  attrs_count_ = h.attr_count;
  ino_buckets_ = reinterpret_cast<const uint32_t*>(p + h.ino_buckets_off);
  ino_bucket_count_ = h.ino_bucket_count;
  root_dev_ = live.root_dev;
  root_ino_ = live.root_ino;
  auto add_dev = [this](uint64_t d) {
    for (int i = 0; i < dev_count_ && i < kDevs; ++i)
      if (devs_[i] == d) return;
    if (dev_count_ < kDevs)
      devs_[dev_count_++] = d;
    else
      dev_count_ = kDevs + 1;  // overflowed: see dataset_dev()
  };
  add_dev(root_dev_);
  for (uint64_t a = 0; a < attrs_count_; ++a) add_dev(attrs_[a].dev);
  for (uint64_t d = 0; d < dirs_; ++d) add_dev(dir_entries_[d].dev);
  generation_ = live.generation;
  small_file_max_ = live.small_file_max;
  stall_ns_ = live.stall_ns;
  tiers_ = h.tier_count;
  consistency_ = live.consistency;
  why_ = {};
}

State JobMap::decode(uint32_t w) const {
  State s{state_of(w), tier_of(w), aux_of(w)};
  bool ok = s.state <= kLastState;
  if (s.state == kCopying || s.state == kCached) ok = ok && s.tier < tiers_;
  if (s.state == kCopying) ok = ok && s.aux < uint32_t(kCopySlots);
  return ok ? s : State{};
}

std::string_view JobMap::path(uint32_t id) const {
  const Entry& e = entries_[id];
  uint64_t off = e.path_off, len = e.path_len;
  if (off + len > strings_size_) return {};
  return {strings_ + off, len};
}

std::string_view JobMap::dir_path(uint32_t id) const {
  const DirEntry& d = dir_entries_[id];
  uint64_t off = d.path_off, len = d.path_len;
  if (off + len > strings_size_) return {};
  return {strings_ + off, len};
}

uint64_t JobMap::hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h ^ (h >> 29);
}

template <typename Path>
int64_t JobMap::probe(const uint32_t* buckets, uint64_t n, uint64_t count, std::string_view rel,
                      Path path) const {
  if (n == 0 || rel.empty()) return -1;
  uint64_t b = bucket_of(hash(rel), n);
  for (uint64_t tries = 0; tries < n; ++tries, b = b + 1 == n ? 0 : b + 1) {
    uint32_t v = buckets[b];
    if (v == 0) return -1;
    if (v - 1 < count && path(v - 1) == rel) return v - 1;
  }
  return -1;  // every bucket taken: a damaged table
}

int64_t JobMap::find(std::string_view rel) const {
  return probe(buckets_, bucket_count_, files_, rel, [this](uint32_t i) { return path(i); });
}

int64_t JobMap::find_dir(std::string_view rel) const {
  return probe(dir_buckets_, dir_bucket_count_, dirs_, rel,
               [this](uint32_t i) { return dir_path(i); });
}

int64_t JobMap::find_inode(uint64_t dev, uint64_t ino) const {
  uint64_t n = ino_bucket_count_;
  if (n == 0) return -1;
  uint64_t b = bucket_of(hash(dev, ino), n);
  for (uint64_t tries = 0; tries < n; ++tries, b = b + 1 == n ? 0 : b + 1) {
    uint32_t v = ino_buckets_[b];
    if (v == 0) return -1;
    if (v - 1 < files_ && entries_[v - 1].ino == ino) {
      const Attr* a = attr(v - 1);
      if (!a || a->dev == dev) return v - 1;
    }
  }
  return -1;
}

int64_t JobMap::find_dir_inode(uint64_t dev, uint64_t ino) const {
  if (dev == root_dev_ && ino == root_ino_) return kRootDir;
  for (uint64_t i = 0; i < dirs_; ++i)  // directories are few; changing one is rare
    if (dir_entries_[i].ino == ino && dir_entries_[i].dev == dev) return int64_t(i);
  return -1;
}

bool JobMap::dataset_dev(uint64_t dev) const {
  if (dev_count_ > kDevs) return true;  // too many to list: every device may hold dataset files
  for (int i = 0; i < dev_count_; ++i)
    if (devs_[i] == dev) return true;
  return false;
}

bool JobMap::stager_alive(uint64_t now_ns) const {
  uint64_t beat = h_->heartbeat_ns.load(std::memory_order_relaxed);
  return beat && !h_->stopping.load(std::memory_order_relaxed) && now_ns - beat < kHeartbeatFreshNs;
}

bool JobMap::queue_stuck(uint64_t queued_ns, uint64_t now_ns) const {
  if (queued_ns > stall_ns_) return true;
  uint64_t moved = h_->copied_ns.load(std::memory_order_relaxed);
  return queued_ns > kQueueGraceNs && now_ns - moved > stall_ns_;
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

bool JobMap::same_version(uint32_t id, const struct stat& st) const {
  const Entry& e = entries_[id];
  const Attr* a = attr(id);
  return a && uint64_t(st.st_dev) == a->dev && uint64_t(st.st_ino) == e.ino &&
         uint64_t(st.st_size) == e.size && to_ns(st.st_mtim) == e.mtime_ns &&
         to_ns(st.st_ctim) == e.ctime_ns;
}

uint64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

uint32_t coarse_now() {
  return uint32_t(monotonic_ns() >> kCoarseShift) & kCoarseMask;
}

int64_t to_ns(const timespec& t) {
  return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
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

void JobMap::touch(uint32_t file) const {
  std::atomic<uint32_t>& w = entries_[file].state;
  uint32_t old = w.load(std::memory_order_relaxed);
  if (state_of(old) != kCached || !(aux_of(old) & kAhead) || (aux_of(old) & kTouched)) return;
  if (w.compare_exchange_strong(old, old | (kTouched << 8))) {
    h_->ahead_touched.fetch_add(entries_[file].size, std::memory_order_relaxed);
    h_->ahead_opened.fetch_add(entries_[file].size, std::memory_order_relaxed);
  }
}

bool copy_name(const JobMap& m, uint32_t file, char* out, size_t cap) {
  std::string_view rel = m.path(file);
  int n = std::snprintf(out, cap, "%s/%.*s", kDataDir, int(rel.size()), rel.data());
  return !rel.empty() && n > 0 && size_t(n) < cap;
}

bool partial_name(const JobMap& m, uint32_t file, char* out, size_t cap) {
  int n = std::snprintf(out, cap, "%s/%llu-%u", kTmpDir, (unsigned long long)m.generation(), file);
  return n > 0 && size_t(n) < cap;
}

bool map_stager_exited(int job_dir_fd) {
  int fd = openat(job_dir_fd, kIndexName, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  char magic[sizeof kMagic];
  int32_t pid = 0;
  bool read =
      pread(fd, magic, sizeof magic, 0) == ssize_t(sizeof magic) &&
      std::memcmp(magic, kMagic, sizeof kMagic) == 0 &&
      pread(fd, &pid, sizeof pid, off_t(offsetof(Header, stager_pid))) == ssize_t(sizeof pid);
  close(fd);
  if (!read || pid <= 0) return false;
  char path[64], stat[512];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  int sfd = open(path, O_RDONLY | O_CLOEXEC);
  if (sfd < 0) return errno == ENOENT;  // gone
  ssize_t n = ::read(sfd, stat, sizeof stat - 1);
  close(sfd);
  if (n <= 0) return false;
  stat[n] = 0;
  const char* paren =
      std::strrchr(stat, ')');  // the name may hold anything, not after the last ')'
  return paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

}  // namespace monarch
