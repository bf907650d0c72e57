// The job map (jobmap.h) as the jobmap and index_wire targets take it: the
// map's bytes up to its counters' slots, less the header's live part
// (Header::heartbeat_ns to its end: the copy slots and the words the stager
// and the library change while the job runs, zero in a map as written and in
// a wire form, and read by no check). That leaves a few KiB for a small
// dataset's map instead of 2 MiB, which a fuzzer can mutate; expand() puts
// the zeros back at their offsets.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "fuzz.h"
#include "jobmap.h"

namespace monarch::fuzz {

inline constexpr size_t kLive = offsetof(Header, heartbeat_ns);
inline constexpr size_t kSlotsBytes = size_t(kProcSlots) * sizeof(ProcSlot);

// The input form of a map's first `size` bytes (at least sizeof(Header)).
inline std::string compact(const char* map, size_t size) {
  return std::string(map, kLive) + std::string(map + sizeof(Header), size - sizeof(Header));
}

// The bytes the input form stands for, written to `out`, which holds
// expanded_size(input.size()) bytes.
inline size_t expanded_size(size_t input) {
  return sizeof(Header) + (input > kLive ? input - kLive : 0);
}
inline void expand(std::string_view input, char* out) {
  size_t head = std::min(input.size(), kLive);
  std::memcpy(out, input.data(), head);
  std::memset(out + head, 0, sizeof(Header) - head);
  if (input.size() > kLive)
    std::memcpy(out + sizeof(Header), input.data() + kLive, input.size() - kLive);
}

// What a valid map promises its readers, whatever its bytes: every lookup
// answers within the map (the sanitizers see any read outside it), and what
// it answers is consistent with the entry it names. At most `limit` entries
// of each table are looked at (a map may list millions).
inline void check_map(const JobMap& m, uint64_t limit = 256) {
  FUZZ_CHECK(m.valid() && m.why().empty());
  FUZZ_CHECK(m.tiers() <= uint32_t(kMapTiers));
  for (uint32_t t = 0; t < m.tiers(); ++t) FUZZ_CHECK(strnlen(m.tier_dir(t), kPathMax) < kPathMax);
  FUZZ_CHECK(strnlen(m.root(), kPathMax) < kPathMax);
  FUZZ_CHECK(m.dataset_dev(m.root_dev()));
  for (uint64_t i = 0; i < m.size() && i < limit; ++i) {
    uint32_t id = uint32_t(i);
    std::string_view p = m.path(id);
    if (!p.empty()) {
      int64_t f = m.find(p);
      FUZZ_CHECK(f == -1 || (uint64_t(f) < m.size() && m.path(uint32_t(f)) == p));
    }
    State s = m.state(id);
    FUZZ_CHECK(uint32_t(s.state) <= kLastState);
    if (s.state == kCopying || s.state == kCached) FUZZ_CHECK(s.tier < m.tiers());
    if (s.state == kCopying) FUZZ_CHECK(m.copy_slot(s.aux) != nullptr);
    struct stat st;
    if (m.fill_stat(id, &st)) {
      FUZZ_CHECK(m.attr(id) != nullptr);
      FUZZ_CHECK(uint64_t(st.st_size) == m.entry(id).size && st.st_ino == m.entry(id).ino);
      FUZZ_CHECK(m.dataset_dev(st.st_dev));
    }
    const Entry& e = m.entry(id);
    const Attr* a = m.attr(id);
    int64_t by_ino = m.find_inode(a ? a->dev : 0, e.ino);
    FUZZ_CHECK(by_ino == -1 ||
               (uint64_t(by_ino) < m.size() && m.entry(uint32_t(by_ino)).ino == e.ino));
    m.for_each_inode(a ? a->dev : 0, e.ino,
                     [&](uint32_t f) { FUZZ_CHECK(f < m.size() && m.entry(f).ino == e.ino); });
    char name[kPathMax];
    if (copy_name(m, id, name, sizeof name)) FUZZ_CHECK(strnlen(name, sizeof name) < sizeof name);
    FUZZ_CHECK(partial_name(m, id, name, sizeof name));
  }
  for (uint64_t i = 0; i < m.dirs() && i < limit; ++i) {
    std::string_view p = m.dir_path(uint32_t(i));
    if (!p.empty()) {
      int64_t d = m.find_dir(p);
      FUZZ_CHECK(d == -1 || (uint64_t(d) < m.dirs() && m.dir_path(uint32_t(d)) == p));
    }
    const DirEntry& d = m.dir(uint32_t(i));
    int64_t by_ino = m.find_dir_inode(d.dev, d.ino);
    FUZZ_CHECK(by_ino == JobMap::kRootDir || (by_ino >= 0 && uint64_t(by_ino) <= i));
    FUZZ_CHECK(m.dataset_dev(d.dev));
  }
  // Names that are no entry's: not found, or found with that very name.
  for (std::string_view rel : {"a", "no/such/file", "class0/f0"}) {
    int64_t f = m.find(rel);
    FUZZ_CHECK(f == -1 || (uint64_t(f) < m.size() && m.path(uint32_t(f)) == rel));
  }
  m.stager_alive(monotonic_ns());
  m.queue_stuck(0, monotonic_ns());
}

}  // namespace monarch::fuzz
