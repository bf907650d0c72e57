// The stage-ahead order: smaller files first, so that tiers too small for the
// dataset hold the most files (the most PFS opens saved in later epochs).
//
// A cursor, not a list of the files: classes of sizes (0-3 bytes each a
// class, then four a power of two: [4k, 5k), [5k, 6k), [6k, 7k), [7k, 8k)),
// and within a class the files in id order (their paths' order), so a file
// may go before one down to 4/5 of its size. It keeps a byte a file, its
// class (or "not held": in a multi-node job, the other nodes' files, or this
// node's), where a list sorted by size took 4 bytes a file (5 MB of a
// 1.28-million-file stager's 130). A pass scans those bytes once (memchr)
// for each class that has files, under the copier's lock.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "jobmap.h"

namespace monarch {

class SizeOrder {
 public:
  static constexpr int kClasses = 252;
  static int size_class(uint64_t size) {
    if (size < 4) return int(size);
    int top = 63 - __builtin_clzll(size);  // 2..63
    return 4 + (top - 2) * 4 + int((size >> (top - 2)) & 3);
  }

  // Over the `n` entries at `entries`; `member` (empty: every file) says
  // which files the order holds. At the first file.
  void reset(const Entry* entries, uint64_t n, const std::vector<bool>& member = {});
  // The file at the cursor, the cursor moved to the next file the order
  // holds; -1 past the last.
  int64_t current();
  void advance();  // past the file at the cursor
  void rewind();   // to the first file again
  bool done() const { return cls_ >= kClasses; }

 private:
  static constexpr uint8_t kNotHeld = 0xff;
  std::vector<uint8_t> class_;              // by file id
  std::array<uint64_t, kClasses> count_{};  // files the order holds, by class
  int cls_ = kClasses;
  uint64_t id_ = 0;
};

}  // namespace monarch
