// How much a copy asks the PFS for at a time.
//
// A file larger than a tier's block starts with small requests and doubles
// them up to the block: a reader that opens the file while it is copied gets
// its first bytes after one small request instead of a whole block (4 MiB is
// 8 ms on a 500 MB/s link, where a reader of 256 KiB waits 0.5 ms), and a copy
// just started holds the PFS's queue, which serves requests in turn, no
// longer than that either. A few more requests a file (four at 4 MiB) cost
// the PFS their latency only. A file of a block or less is one request: its
// copies are bound by the PFS's latency, not its bandwidth.
#pragma once

#include <algorithm>
#include <cstdint>

namespace monarch {

inline constexpr uint64_t kFirstRequest = 256 << 10;

// The next request of a copy of a `size`-byte file with `done` bytes copied.
inline uint64_t request_size(uint64_t done, uint64_t size, uint64_t block) {
  if (size <= block) return block;
  return std::min(block, std::max(done, kFirstRequest));
}

}  // namespace monarch
