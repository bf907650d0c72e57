#include "index_wire.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "fd.h"

namespace monarch {
namespace {

// Puts file `i` into an open-addressing table of `n` buckets keyed by `hash`.
void insert(uint32_t* bucket, uint64_t n, uint64_t hash, uint32_t i) {
  for (uint64_t b = JobMap::bucket_of(hash, n), tries = 0; tries < n;
       ++tries, b = b + 1 == n ? 0 : b + 1)
    if (bucket[b] == 0) {
      bucket[b] = i + 1;
      return;
    }
}

// Renumbers the walking node's device `from` to `to` everywhere the map holds
// a device, and rebuilds the table of files by identity, whose hash includes
// it. Only when every file and directory is on `from`.
void renumber(char* p, const Header& h, uint64_t from, uint64_t to) {
  auto* attrs = reinterpret_cast<Attr*>(p + h.attrs_off);
  auto* entries = reinterpret_cast<Entry*>(p + h.entries_off);
  auto* dirs = reinterpret_cast<DirEntry*>(p + h.dirs_off);
  bool one = true;
  for (uint64_t i = 0; i < h.attr_count; ++i) one = one && attrs[i].dev == from;
  for (uint64_t i = 0; i < h.file_count; ++i) one = one && entries[i].attr < h.attr_count;
  for (uint64_t i = 0; i < h.dir_count; ++i) one = one && dirs[i].dev == from;
  if (!one)
    throw std::runtime_error(
        "the dataset spans several devices (or files the index cannot describe exactly), and "
        "this node numbers its devices differently from the node that walked it");
  for (uint64_t i = 0; i < h.attr_count; ++i) attrs[i].dev = to;
  for (uint64_t i = 0; i < h.dir_count; ++i) dirs[i].dev = to;
  auto* ino = reinterpret_cast<uint32_t*>(p + h.ino_buckets_off);
  std::memset(ino, 0, h.ino_bucket_count * sizeof(uint32_t));
  for (uint64_t i = 0; i < h.file_count; ++i)
    insert(ino, h.ino_bucket_count, JobMap::hash(to, entries[i].ino), uint32_t(i));
}

// Does every table of `h` lie between the header and the counters' slots,
// the part a wire form carries? (JobMap checks them against the whole file,
// slots included.)
bool tables_inside(const Header& h) {
  auto inside = [&](uint64_t off, uint64_t count, uint64_t size) {
    return off >= sizeof(Header) && off <= h.slots_off && count <= (h.slots_off - off) / size;
  };
  return inside(h.entries_off, h.file_count, sizeof(Entry)) &&
         inside(h.strings_off, h.strings_size, 1) &&
         inside(h.buckets_off, h.bucket_count, sizeof(uint32_t)) &&
         inside(h.attrs_off, h.attr_count, sizeof(Attr)) &&
         inside(h.dirs_off, h.dir_count, sizeof(DirEntry)) &&
         inside(h.dir_buckets_off, h.dir_bucket_count, sizeof(uint32_t)) &&
         inside(h.ino_buckets_off, h.ino_bucket_count, sizeof(uint32_t));
}

// Zeroes, in `chunk` (the map's bytes [off, off + n)), the bytes of field
// [field, field + size) of each of the `count` records of `stride` bytes from
// `table`: a live word, which only the node that holds it may read.
void zero_field(char* chunk, uint64_t off, size_t n, uint64_t table, uint64_t count, size_t stride,
                size_t field, size_t size) {
  uint64_t end = off + n;
  if (count == 0 || end <= table || off >= table + count * stride) return;
  uint64_t first = off > table ? (off - table) / stride : 0;
  for (uint64_t i = first; i < count; ++i) {
    uint64_t a = table + i * stride + field, b = a + size;
    if (a >= end) break;
    uint64_t from = std::max(a, off), to = std::min(b, end);
    if (from < to) std::memset(chunk + (from - off), 0, to - from);
  }
}

}  // namespace

void index_wire_chunks(const JobMap& map, const std::function<void(const char*, size_t)>& out) {
  const Header& h = map.header();
  Header w;
  std::memcpy(static_cast<void*>(&w), &h, sizeof w);
  // What is this node's alone: its generation, tiers and live words.
  w.generation = 0;
  std::memset(w.tier_dirs, 0, sizeof w.tier_dirs);
  std::memset(w.tier_dev, 0, sizeof w.tier_dev);
  std::memset(w.tier_ino, 0, sizeof w.tier_ino);
  size_t live = offsetof(Header, heartbeat_ns);
  std::memset(reinterpret_cast<char*>(&w) + live, 0, sizeof(Header) - live);
  out(reinterpret_cast<const char*>(&w), sizeof w);
  // Each chunk is copied once, its live words (a file's state, a directory's
  // stale mark, which the copier and the readers change meanwhile) zeroed:
  // what `out` gets stays as given, so that a sender that writes a chunk and
  // hashes it hashes what it wrote, and a map gives one wire form.
  const char* p = reinterpret_cast<const char*>(&h);
  std::vector<char> chunk(size_t(std::min<uint64_t>(h.slots_off - sizeof(Header), kWireChunk)));
  for (uint64_t off = sizeof(Header); off < h.slots_off;) {
    size_t n = size_t(std::min<uint64_t>(h.slots_off - off, kWireChunk));
    std::memcpy(chunk.data(), p + off, n);
    zero_field(chunk.data(), off, n, h.entries_off, h.file_count, sizeof(Entry),
               offsetof(Entry, state), sizeof(Entry::state));
    zero_field(chunk.data(), off, n, h.dirs_off, h.dir_count, sizeof(DirEntry),
               offsetof(DirEntry, stale), sizeof(DirEntry::stale));
    out(chunk.data(), n);
    off += n;
  }
}

std::string index_wire(const JobMap& map) {
  std::string wire;
  index_wire_chunks(map, [&](const char* p, size_t n) { wire.append(p, n); });
  return wire;
}

MappedMap build_index_from(const IndexOptions& opt, std::string_view wire, IndexStats& stats,
                           const std::function<void(JobMap&)>& before_publish) {
  auto read = [wire](uint64_t off, char* dst, size_t len) {
    if (off > wire.size() || len > wire.size() - off) return false;
    std::memcpy(dst, wire.data() + off, len);
    return true;
  };
  return build_index_from(opt, wire.size(), read, stats, before_publish);
}

MappedMap build_index_from(const IndexOptions& opt, int fd, uint64_t size, IndexStats& stats,
                           const std::function<void(JobMap&)>& before_publish) {
  auto read = [fd](uint64_t off, char* dst, size_t len) {
    return pread_full(fd, dst, len, off) == len;
  };
  return build_index_from(opt, size, read, stats, before_publish);
}

MappedMap build_index_from(const IndexOptions& opt, uint64_t size, const WireReader& read,
                           IndexStats& stats, const std::function<void(JobMap&)>& before_publish) {
  auto start = std::chrono::steady_clock::now();
  Header h;
  if (size < sizeof(Header) || !read(0, reinterpret_cast<char*>(&h), sizeof h) ||
      std::memcmp(h.magic, kMagic, sizeof kMagic) != 0)
    throw std::runtime_error("the index received is not a Monarch index of this version");
  if (h.slots_off != size || h.entries_off < sizeof(Header))
    throw std::runtime_error("the index received is truncated (" + std::to_string(size) +
                             " bytes)");
  if (!tables_inside(h))
    throw std::runtime_error("the index received is damaged: a table lies outside it");
  if (strnlen(h.root, kPathMax) == kPathMax || opt.root != h.root)
    throw std::runtime_error("the index received is of another dataset (" +
                             std::string(h.root, strnlen(h.root, kPathMax)) + ", not " + opt.root +
                             ")");
  struct stat root;
  if (stat(opt.root.c_str(), &root) != 0)
    throw std::runtime_error("cannot stat the dataset " + opt.root + ": " + std::strerror(errno));
  if (uint64_t(root.st_ino) != h.root_ino)
    throw std::runtime_error("the dataset " + opt.root +
                             " is another directory here than on the node that walked it");

  uint64_t total = h.slots_off + kProcSlots * sizeof(ProcSlot);
  std::string tmp = opt.out_path + ".tmp";
  MappedMap result = create_map_file(opt.out_path, total);
  char* p = static_cast<char*>(result.base());
  for (uint64_t off = 0; off < size;) {
    size_t n = size_t(std::min<uint64_t>(size - off, kWireChunk));
    if (!read(off, p + off, n))
      throw std::runtime_error("the index received cannot be read back at byte " +
                               std::to_string(off));
    off += n;
  }
  std::memcpy(p, static_cast<const void*>(&h),
              sizeof h);  // the header checked above, whatever was read again
  size_t live = offsetof(Header, heartbeat_ns);  // the sender's live words are not ours
  std::memset(p + live, 0, sizeof(Header) - live);
  auto* w = reinterpret_cast<Header*>(p);
  w->file_size = total;
  w->generation = opt.generation;
  w->consistency = opt.consistency;
  w->small_file_max = opt.small_file_max;
  w->stall_ns = opt.stall_ns;
  set_tiers(*w, opt.tier_dirs);
  w->next_slot = 1;  // as build_index: slot 0 is shared
  // Every table is checked against the size before anything below reads it.
  result.reload();
  if (!result.map().valid())
    throw std::runtime_error("the index received is damaged: " + std::string(result.map().why()));
  for (uint64_t i = 0; i < w->file_count; ++i)
    result.map().entry(uint32_t(i)).state.store(make_state(kNone), std::memory_order_relaxed);
  for (uint64_t i = 0; i < w->dir_count; ++i)
    result.map().dir(uint32_t(i)).stale.store(0, std::memory_order_relaxed);
  if (uint64_t(root.st_dev) != w->root_dev) {
    renumber(p, *w, w->root_dev, root.st_dev);
    w->root_dev = root.st_dev;
    result.reload();
  }
  before_publish(result.map());
  if (rename(tmp.c_str(), opt.out_path.c_str()) != 0)
    throw std::runtime_error("cannot publish " + opt.out_path + ": " + std::strerror(errno));
  stats.files = w->file_count;
  stats.bytes = w->dataset_bytes;
  stats.dirs = w->dir_count;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.metadata_calls = 1;
  return result;
}

}  // namespace monarch
