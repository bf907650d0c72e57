// The stage-ahead order: smaller files first, so that tiers too small for the
// dataset hold the most files (the most PFS opens saved in later epochs).
//
// A cursor, not a list of the files: classes of sizes (empty files, then one
// class per power of two), and within a class the files in id order (their
// paths' order). It keeps a count a class and, in a multi-node job, a bit a
// file (this node's own files, or the others'), where a list sorted by size
// took 4 bytes a file (5 MB of a 1.28-million-file stager's 130). A pass
// reads each entry's size once for each class that has files; a file passed
// over within a class is at most twice the size of the smallest left in it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "jobmap.h"

namespace monarch {

class SizeOrder {
 public:
  static constexpr int kClasses = 65;  // 0 bytes; then [2^(k-1), 2^k) for k = 1..64
  static int size_class(uint64_t size) { return size ? 64 - __builtin_clzll(size) : 0; }

  // Over the `n` entries at `entries` (which outlive the order); `member`
  // (empty: every file) says which files the order holds. At the first file.
  void reset(const Entry* entries, uint64_t n, std::vector<bool> member = {});
  // The file at the cursor, the cursor moved to the next file the order
  // holds; -1 past the last.
  int64_t current();
  void advance();  // past the file at the cursor
  void rewind();   // to the first file again
  bool done() const { return cls_ >= kClasses; }

 private:
  bool holds(uint64_t id) const { return member_.empty() || member_[id]; }
  const Entry* entries_ = nullptr;
  uint64_t n_ = 0;
  std::vector<bool> member_;
  std::array<uint64_t, kClasses> count_{};  // files the order holds, by class
  int cls_ = kClasses;
  uint64_t id_ = 0;
};

}  // namespace monarch
