#include "index.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <tbb/enumerable_thread_specific.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for_each.h>
#include <tbb/parallel_sort.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <thread>
#include <tuple>

namespace monarch {
namespace {

// Metadata calls the walk keeps in flight. Measured on the emulated PFS (200 us
// per stat, 128,000 files in 100 directories, 2 cores): 2 threads 27.8 s,
// 8 threads 6.3 s, 32 threads 6.1 s (then bound by the CPU).
constexpr int kWalkThreads = 16;

// What the walk keeps of one file until the map is written: the fields of its
// Entry, its device, and its path.
struct Found {
  uint64_t path;  // during the walk: the path's address in its thread's names;
                  // then its offset in the map's string table
  uint64_t dev, ino, size;
  int64_t mtime_ns, ctime_ns, atime_ns;
  uint32_t blocks;
  uint16_t attr, path_len;
};
static_assert(sizeof(Found) == 64);

// Memory the walk takes and gives back a chunk at a time (mmap, munmap:
// malloc's heap would keep it), so that the walk's records and the map they
// become are never resident in full at once: the stager's peak stays near the
// map's own size (Index.WalkMemoryIsTheMapsSize).
constexpr size_t kChunkBytes = size_t(1) << 20;

char* take_chunk(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return static_cast<char*>(p);
}

// One walk thread's files, in the order it found them, and their paths, in
// the same order.
struct FoundList {
  std::vector<Found*> chunks;
  size_t last = 0;  // records in chunks.back()
  std::vector<char*> names;
  size_t names_used = 0;    // bytes of names.back()
  uint64_t name_bytes = 0;  // of all paths
  static constexpr size_t kPerChunk = kChunkBytes / sizeof(Found);

  FoundList() = default;
  FoundList(const FoundList&) = delete;
  ~FoundList() {
    for (Found* c : chunks)
      if (c) munmap(c, kChunkBytes);
    for (char* c : names)
      if (c) munmap(c, kChunkBytes);
  }
  size_t size() const { return chunks.empty() ? 0 : (chunks.size() - 1) * kPerChunk + last; }
  // Adds `dir`/`name` (or `name` at the root) with the fields of `f`; false
  // for a path longer than an Entry holds (the file is read from the PFS).
  bool add(const std::string& dir, const char* name, size_t name_len, Found f) {
    size_t len = dir.empty() ? name_len : dir.size() + 1 + name_len;
    if (len > 0xffff) return false;
    if (names.empty() || names_used + len > kChunkBytes) {
      names.push_back(take_chunk(kChunkBytes));
      names_used = 0;
    }
    char* p = names.back() + names_used;
    if (!dir.empty()) {
      std::memcpy(p, dir.data(), dir.size());
      p[dir.size()] = '/';
      std::memcpy(p + dir.size() + 1, name, name_len);
    } else {
      std::memcpy(p, name, name_len);
    }
    names_used += len;
    name_bytes += len;
    f.path = reinterpret_cast<uint64_t>(p);
    f.path_len = uint16_t(len);
    if (chunks.empty() || last == kPerChunk) {
      chunks.push_back(reinterpret_cast<Found*>(take_chunk(kChunkBytes)));
      last = 0;
    }
    chunks.back()[last++] = f;
    return true;
  }
};

struct Dir {
  std::string rel;
  uint64_t dev, ino;
};

// The attribute table: the stat fields most files share, by value, so that an
// Entry holds a 2-byte id. Taken under a lock: a few hundred nanoseconds
// beside each file's stat on the PFS.
using AttrKey = std::tuple<uint64_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;
class Attrs {
 public:
  uint16_t id(const struct stat& st) {
    AttrKey k{st.st_dev,
              st.st_mode,
              st.st_uid,
              st.st_gid,
              uint32_t(st.st_nlink),
              uint32_t(st.st_blksize)};
    std::lock_guard<std::mutex> lock(mu_);
    auto a = ids_.find(k);
    if (a != ids_.end()) return a->second;
    if (table_.size() >= kNoAttr) return kNoAttr;
    ids_.emplace(k, uint16_t(table_.size()));
    table_.push_back(Attr{st.st_dev, st.st_mode, st.st_uid, st.st_gid, uint32_t(st.st_nlink),
                          uint32_t(st.st_blksize), 0});
    return uint16_t(table_.size() - 1);
  }
  const std::vector<Attr>& table() const { return table_; }

 private:
  std::mutex mu_;
  std::map<AttrKey, uint16_t> ids_;
  std::vector<Attr> table_;
};

// Paces the walk's metadata calls (stat, opendir), over all threads: at most
// `rate` a second (0: unpaced), after a slow start. The walk begins with the
// job, whose own start (its interpreter, its imports, its first files) wants
// the same metadata server and, on a small node, the same cores: at first the
// walk makes kRampStartRate calls a second, twice as many every
// kRampDoublingNs, until it reaches `rate` (unpaced: for kRampDoublings).
// On 1.28 M files (contrib/bench/run --only scale, 2 cores) this took the
// job's first read, programs cached, from +17..+48 ms to +2..+10 ms of the
// direct run's; the index of a 2,024-file dataset takes 0.07 s, not 0.04 s.
// Each call has its turn, one gap after the last one's: a walk that fell
// behind (a stalled server, no CPU) catches up by kCatchUpNs, never more.
class Pace {
 public:
  Pace(uint64_t rate, const std::atomic<bool>* stop)
      : rate_(double(rate)), start_ns_(monotonic_ns()), next_ns_(start_ns_), stop_(stop) {}
  // Waits for the walk's next turn (50 ms at a time, and not once it is stopped).
  void one() {
    calls_.fetch_add(1, std::memory_order_relaxed);
    uint64_t now = monotonic_ns();
    double rate = rate_at(now - start_ns_);
    if (rate <= 0) return;
    uint64_t gap = uint64_t(1e9 / rate), oldest = now - std::min(now, kCatchUpNs);
    uint64_t last = next_ns_.load(std::memory_order_relaxed), due;
    do due = std::max(last, oldest);
    while (!next_ns_.compare_exchange_weak(last, due + gap, std::memory_order_relaxed));
    for (; due > now + kSlackNs && !stopped(); now = monotonic_ns()) {
      timespec ts{0, long(std::min<uint64_t>(due - now, 50'000'000))};
      nanosleep(&ts, nullptr);
    }
  }
  bool stopped() const { return stop_ && stop_->load(std::memory_order_relaxed); }
  uint64_t calls() const { return calls_.load(); }

 private:
  // The calls a second allowed `ns` after the start; 0: no limit.
  double rate_at(uint64_t ns) const {
    double ramp = kRampStartRate * std::exp2(double(ns) / double(kRampDoublingNs));
    if (rate_ > 0) return std::min(ramp, rate_);
    return ns < kRampDoublings * kRampDoublingNs ? ramp : 0;
  }
  static constexpr double kRampStartRate = 2000;  // calls a second
  static constexpr uint64_t kRampDoublingNs = 10'000'000;
  static constexpr uint64_t kRampDoublings = 10;  // unpaced after 0.1 s
  static constexpr uint64_t kCatchUpNs = 10'000'000;
  static constexpr uint64_t kSlackNs = 1'000'000;  // a turn this close is taken at once
  double rate_;
  uint64_t start_ns_;
  std::atomic<uint64_t> next_ns_;  // the next call's turn
  const std::atomic<bool>* stop_;
  std::atomic<uint64_t> calls_{0};
};

struct WalkState {
  WalkState(uint64_t rate, const std::atomic<bool>* stop) : pace(rate, stop) {}
  tbb::enumerable_thread_specific<FoundList> files;
  tbb::enumerable_thread_specific<std::vector<Dir>> dirs_found;  // below the root
  Attrs attrs;
  std::atomic<uint64_t> dirs{0}, skipped{0}, unreadable{0};
  Pace pace;
};

std::string join(const std::string& dir, const char* name) {
  return dir.empty() ? std::string(name) : dir + "/" + name;
}

// The walk runs while the job starts and reads (its reads pass through to the
// PFS until the map exists): its threads take the CPU only when the job does
// not want it. A 1.28-million-file walk on 2 cores (contrib/bench/run --only
// scale, programs cached): the job's first read 34 ms directly, 186 ms at the
// default priority, 50 ms at this one.
constexpr int kWalkNice = 19;

int64_t ns(const timespec& t) {
  return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

Found found(const struct stat& st, uint16_t attr) {
  Found f{};
  // st_blocks past 32 bits: stat goes to the PFS (kNoAttr), which knows it.
  f.attr = st.st_blocks <= 0xffffffff ? attr : kNoAttr;
  f.blocks = uint32_t(std::min<uint64_t>(st.st_blocks, 0xffffffff));
  f.dev = st.st_dev;
  f.ino = st.st_ino;
  f.size = st.st_size;
  f.mtime_ns = ns(st.st_mtim);
  f.ctime_ns = ns(st.st_ctim);
  f.atime_ns = ns(st.st_atim);
  return f;
}

// Lists one directory (relative to root_fd); feeds subdirectories back.
template <typename Feeder>
void walk_dir(int root_fd, const std::string& rel, WalkState& w, Feeder& feeder) {
  thread_local bool niced = setpriority(PRIO_PROCESS, id_t(gettid()), kWalkNice) == 0;
  (void)niced;
  if (w.pace.stopped()) return;
  w.pace.one();
  int fd = rel.empty()
               ? dup(root_fd)
               : openat(root_fd, rel.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  DIR* d = fd < 0 ? nullptr : fdopendir(fd);
  if (!d) {
    if (fd >= 0) close(fd);
    w.unreadable++;
    return;
  }
  w.dirs++;
  struct stat dst;
  if (!rel.empty() && fstat(fd, &dst) == 0)
    w.dirs_found.local().push_back(Dir{rel, dst.st_dev, dst.st_ino});
  auto& out = w.files.local();
  while (dirent* e = readdir(d)) {
    if (w.pace.stopped()) break;
    const char* name = e->d_name;
    if (name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0))) continue;
    if (e->d_type == DT_DIR) {
      feeder.add(join(rel, name));
      continue;
    }
    if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN) {
      w.skipped++;
      continue;
    }
    struct stat st;
    w.pace.one();
    if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      w.skipped++;
      continue;
    }
    if (S_ISDIR(st.st_mode))
      feeder.add(join(rel, name));
    else if (!S_ISREG(st.st_mode) ||
             !out.add(rel, name, std::strlen(name), found(st, w.attrs.id(st))))
      w.skipped++;
  }
  closedir(d);
}

// Puts id `i` in the first free bucket from `hash`'s (open addressing; the
// table has more buckets than ids).
void place(uint32_t* table, uint64_t buckets, uint64_t hash, size_t i) {
  for (uint64_t b = JobMap::bucket_of(hash, buckets);; b = b + 1 == buckets ? 0 : b + 1)
    if (table[b] == 0) {
      table[b] = uint32_t(i + 1);
      return;
    }
}

void copy_path(char (&dst)[kPathMax], const std::string& src) {
  if (src.size() >= kPathMax) throw std::runtime_error("path too long: " + src);
  std::memcpy(dst, src.c_str(), src.size() + 1);
}

size_t align64(size_t n) {
  return (n + 63) & ~size_t(63);
}

}  // namespace

MappedMap& MappedMap::operator=(MappedMap&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(base_, size_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    map_ = o.map_;
  }
  return *this;
}

MappedMap::~MappedMap() {
  if (base_) munmap(base_, size_);
}

MappedMap build_index(const IndexOptions& opt, IndexStats& stats,
                      const std::function<void(JobMap&)>& before_publish) {
  auto start = std::chrono::steady_clock::now();
  int root_fd = open(opt.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0)
    throw std::runtime_error("cannot open the dataset " + opt.root + ": " + std::strerror(errno));
  char real[PATH_MAX];
  if (!realpath(opt.root.c_str(), real)) std::strcpy(real, opt.root.c_str());
  struct stat root_st;
  if (fstat(root_fd, &root_st) != 0) root_st = {};

  WalkState w(opt.index_rate, opt.stop);
  std::vector<std::string> top{""};
  std::exception_ptr failed;
  {
    // The walk waits on the metadata server, not on the CPU: kWalkThreads
    // calls in flight whatever the core count (oneTBB's default is one
    // thread a core, so tbb::global_control lifts its limit for the walk).
    // From a thread of its own, so that the caller's priority stays its own;
    // what the walk throws (bad_alloc under a memory limit) is thrown here.
    std::thread([&] {
      try {
        tbb::global_control allow(tbb::global_control::max_allowed_parallelism, kWalkThreads);
        tbb::task_arena arena(kWalkThreads);
        arena.execute([&] {
          tbb::parallel_for_each(top.begin(), top.end(), [&](const std::string& rel, auto& feeder) {
            walk_dir(root_fd, rel, w, feeder);
          });
        });
      } catch (...) {
        failed = std::current_exception();
      }
    }).join();
  }
  close(root_fd);
  if (failed) std::rethrow_exception(failed);
  stats.stopped = w.pace.stopped();

  // Every file once, in one array: each thread's records are moved in and
  // their paths copied into the map's string table, a chunk at a time, each
  // chunk given back once moved.
  uint64_t count = 0, strings = 0;
  for (FoundList& l : w.files) count += l.size();
  if (count >= 0xfffffff0u) throw std::runtime_error("too many files in the dataset");
  std::vector<Dir> dirs;
  for (auto& v : w.dirs_found) {
    dirs.insert(dirs.end(), std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
    std::vector<Dir>().swap(v);
  }
  std::sort(dirs.begin(), dirs.end(), [](const Dir& a, const Dir& b) { return a.rel < b.rel; });
  for (FoundList& l : w.files) strings += l.name_bytes;
  for (const Dir& d : dirs) strings += d.rel.size();
  if (strings > 0xffffffffu)  // an Entry holds a 32-bit offset
    throw std::runtime_error("the dataset's paths take more than 4 GiB: too many files");
  const std::vector<Attr>& attrs = w.attrs.table();

  // Layout.
  uint64_t buckets = count + count / 4 + 1;
  uint64_t dir_buckets = dirs.size() * 2 + 1;
  uint64_t ino_buckets = count + count / 4 + 1;
  size_t off = align64(sizeof(Header));
  size_t entries_off = off;
  off = align64(off + count * sizeof(Entry));
  size_t strings_off = off;
  off = align64(off + strings);
  size_t buckets_off = off;
  off = align64(off + buckets * sizeof(uint32_t));
  size_t attrs_off = off;
  off = align64(off + attrs.size() * sizeof(Attr));
  size_t dirs_off = off;
  off = align64(off + dirs.size() * sizeof(DirEntry));
  size_t dir_buckets_off = off;
  off = align64(off + dir_buckets * sizeof(uint32_t));
  size_t ino_buckets_off = off;
  off = align64(off + ino_buckets * sizeof(uint32_t));
  size_t slots_off = off;
  size_t total = off + kProcSlots * sizeof(ProcSlot);

  std::string tmp = opt.out_path + ".tmp";
  MappedMap result = create_map_file(opt.out_path, total);
  char* p = static_cast<char*>(result.base());
  auto* h = new (p) Header();
  std::memcpy(h->magic, kMagic, sizeof kMagic);
  h->generation = opt.generation;
  h->file_size = total;
  h->file_count = count;
  h->consistency = opt.consistency;
  h->small_file_max = opt.small_file_max;
  h->stall_ns = opt.stall_ns;
  h->entries_off = entries_off;
  h->strings_off = strings_off;
  h->strings_size = strings;
  h->buckets_off = buckets_off;
  h->bucket_count = buckets;
  h->attrs_off = attrs_off;
  h->attr_count = attrs.size();
  h->dirs_off = dirs_off;
  h->dir_count = dirs.size();
  h->dir_buckets_off = dir_buckets_off;
  h->dir_bucket_count = dir_buckets;
  h->ino_buckets_off = ino_buckets_off;
  h->ino_bucket_count = ino_buckets;
  h->root_dev = root_st.st_dev;
  h->root_ino = root_st.st_ino;
  h->slots_off = slots_off;
  h->next_slot = 1;  // slot 0 is shared by the processes that find no free slot
  copy_path(h->root, opt.root);
  copy_path(h->real_root, real);
  set_tiers(*h, opt.tier_dirs);
  // No attributes (no files): attrs.data() may be null, which memcpy may not take.
  if (!attrs.empty()) std::memcpy(p + attrs_off, attrs.data(), attrs.size() * sizeof(Attr));

  char* str = p + strings_off;
  size_t so = 0;
  size_t all_bytes = std::max<size_t>(count * sizeof(Found), 1);
  auto* all = reinterpret_cast<Found*>(take_chunk(all_bytes));
  struct Give {
    void* p;
    size_t n;
    void release() {
      if (p) munmap(std::exchange(p, nullptr), n);
    }
    ~Give() { release(); }
  } give_all{all, all_bytes};
  size_t n = 0;
  for (FoundList& l : w.files) {
    size_t name_chunk = 0;
    for (size_t c = 0; c < l.chunks.size(); ++c) {
      for (size_t i = 0, k = c + 1 < l.chunks.size() ? l.kPerChunk : l.last; i < k; ++i) {
        Found f = l.chunks[c][i];
        const char* name = reinterpret_cast<const char*>(f.path);
        // Paths are in the order of their records: a chunk of them is done
        // when the next path is past it.
        while (!(name >= l.names[name_chunk] && name < l.names[name_chunk] + kChunkBytes)) {
          munmap(l.names[name_chunk], kChunkBytes);
          l.names[name_chunk++] = nullptr;
        }
        std::memcpy(str + so, name, f.path_len);
        f.path = so;
        so += f.path_len;
        all[n++] = f;
      }
      munmap(l.chunks[c], kChunkBytes);
      l.chunks[c] = nullptr;
    }
    for (char*& c : l.names)
      if (c) munmap(std::exchange(c, nullptr), kChunkBytes);
  }
  tbb::parallel_sort(all, all + count, [str](const Found& a, const Found& b) {
    return std::string_view(str + a.path, a.path_len) < std::string_view(str + b.path, b.path_len);
  });

  // The entries, in path order; the sorted records are given back as they
  // are written. Then the buckets, from the entries: the map's pages and the
  // records' together never take much more than the map alone.
  auto* entries = reinterpret_cast<Entry*>(p + entries_off);
  auto* bucket = reinterpret_cast<uint32_t*>(p + buckets_off);
  auto* ino_bucket = reinterpret_cast<uint32_t*>(p + ino_buckets_off);
  uint64_t bytes = 0;
  size_t given = 0;  // bytes of `all` given back
  // The device of each file whose Entry has no attributes (rare: more than
  // kNoAttr kinds, or st_blocks past 32 bits), by id.
  std::vector<std::pair<uint32_t, uint64_t>> other_devs;
  for (size_t i = 0; i < count; ++i) {
    const Found& f = all[i];
    Entry* e = new (&entries[i]) Entry();
    e->path_off = uint32_t(f.path);
    e->path_len = f.path_len;
    e->attr = f.attr;
    e->blocks = f.blocks;
    e->ino = f.ino;
    e->size = f.size;
    e->mtime_ns = f.mtime_ns;
    e->ctime_ns = f.ctime_ns;
    e->atime_ns = f.atime_ns;
    bytes += f.size;
    if (f.attr == kNoAttr) other_devs.emplace_back(uint32_t(i), f.dev);
    if (size_t done = (i + 1) * sizeof(Found) / kChunkBytes * kChunkBytes; done > given) {
      madvise(reinterpret_cast<char*>(all) + given, done - given, MADV_DONTNEED);
      given = done;
    }
  }
  give_all.release();
  for (size_t i = 0, other = 0; i < count; ++i) {
    // Read back from the shared file: checked, as another process of the
    // user could write it (index.tmp is the user's own).
    uint64_t off = entries[i].path_off, len = entries[i].path_len, ino = entries[i].ino;
    uint16_t attr = entries[i].attr;
    if (off + len > strings ||
        (attr != kNoAttr ? attr >= attrs.size() : other >= other_devs.size()))
      throw std::runtime_error("the index of " + opt.root + " was changed while it was written");
    place(bucket, buckets, JobMap::hash(std::string_view(str + off, len)), i);
    uint64_t dev = attr != kNoAttr ? attrs[attr].dev : other_devs[other++].second;
    place(ino_bucket, ino_buckets, JobMap::hash(dev, ino), i);
  }
  auto* dir_entries = reinterpret_cast<DirEntry*>(p + dirs_off);
  auto* dir_bucket = reinterpret_cast<uint32_t*>(p + dir_buckets_off);
  for (size_t i = 0; i < dirs.size(); ++i) {
    DirEntry* d = new (&dir_entries[i]) DirEntry();
    const std::string& rel = dirs[i].rel;
    d->path_off = uint32_t(so);
    d->path_len = uint16_t(rel.size());
    d->dev = dirs[i].dev;
    d->ino = dirs[i].ino;
    std::memcpy(str + so, rel.data(), rel.size());
    so += rel.size();
    place(dir_bucket, dir_buckets, JobMap::hash(rel), i);
  }
  h->dataset_bytes = bytes;
  result.reload();  // the view checks what was written
  if (!result.map().valid())
    throw std::runtime_error("the index of " + opt.root +
                             " is inconsistent: " + std::string(result.map().why()));
  before_publish(result.map());
  if (rename(tmp.c_str(), opt.out_path.c_str()) != 0)
    throw std::runtime_error("cannot publish " + opt.out_path + ": " + std::strerror(errno));

  stats.files = count;
  stats.bytes = bytes;
  stats.dirs = w.dirs;
  stats.skipped = w.skipped;
  stats.unreadable = w.unreadable;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.metadata_calls = w.pace.calls();
  return result;
}

MappedMap create_map_file(const std::string& out_path, uint64_t total) {
  std::string tmp = out_path + ".tmp";
  unlink(tmp.c_str());
  int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno));
  if (int e = posix_fallocate(fd, 0, off_t(total)); e != 0) {
    close(fd);
    unlink(tmp.c_str());
    throw std::runtime_error("cannot allocate " + std::to_string(total) + " bytes for " + tmp +
                             ": " + std::strerror(e));
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    unlink(tmp.c_str());
    throw std::runtime_error("cannot map " + tmp + ": " + std::strerror(errno));
  }
  return MappedMap(base, total);
}

void set_tiers(Header& h, const std::vector<std::string>& tier_dirs) {
  if (tier_dirs.size() > size_t(kMapTiers))
    throw std::runtime_error("more than " + std::to_string(kMapTiers) + " tiers");
  h.tier_count = uint32_t(tier_dirs.size());
  std::memset(h.tier_dirs, 0, sizeof h.tier_dirs);
  for (size_t t = 0; t < tier_dirs.size(); ++t) {
    copy_path(h.tier_dirs[t], tier_dirs[t]);
    // A directory that is not there (yet) gets no identity: no process finds
    // it, and its copies are read from the PFS.
    struct stat st {};
    bool there = stat(tier_dirs[t].c_str(), &st) == 0;
    h.tier_dev[t] = there ? st.st_dev : 0;
    h.tier_ino[t] = there ? st.st_ino : 0;
  }
}

MappedMap open_index(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st;
  fstat(fd, &st);
  void* base = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED)
    throw std::runtime_error("cannot map " + path + ": " + std::strerror(errno));
  MappedMap m(base, st.st_size);
  if (!m.map().valid()) throw std::runtime_error(path + ": " + std::string(m.map().why()));
  return m;
}

}  // namespace monarch
