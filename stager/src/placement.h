// Placement: which node-local tier a file goes to. Tiers are filled top-down,
// nothing is ever evicted (the seed's 4.1.2: under a random order every file is
// read once an epoch, so eviction only adds PFS reads). A tier has room for a
// file when both its quota and its file system's real free space allow it;
// tiers on one file system share its free space, counted once.
// Pure logic: the free space comes from a callback, so tests need no disk.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

namespace monarch {

class Placement {
 public:
  struct Tier {
    uint64_t quota;   // bytes of disk space, counted in whole blocks
    uint64_t block;   // allocation unit of its file system (statvfs f_frsize)
    uint64_t fs = 0;  // its file system (st_dev + 1): tiers on one share its free space; 0: its own
  };
  // free_bytes(t): bytes an unprivileged writer may still use on tier t's file
  // system (statvfs f_bavail * f_frsize). reserve: bytes always left free.
  Placement(std::vector<Tier> tiers, std::function<uint64_t(int)> free_bytes, uint64_t reserve);

  // Disk space a file of `size` bytes takes on tier t.
  uint64_t footprint(int t, uint64_t size) const;

  // Reserves room for a file of `size` bytes on the first tier with room and
  // returns the tier, or -1. `keep`: bytes the tiers together must still have
  // room for afterwards (a multi-node job's files homed here, not placed
  // yet, before any other node's). All calls are thread-safe; sizes are
  // file sizes.
  int reserve(uint64_t size, uint64_t keep = 0);
  // The copy is complete: its blocks now show in the file system's free space.
  void written(int tier, uint64_t size);
  // The copy was abandoned: its reservation is returned.
  void release(int tier, uint64_t size);
  // A copy found at start, already on disk.
  void adopt(int tier, uint64_t size);
  // The tier's file system ran out of space: place nothing more there.
  void mark_full(int tier);

  // Bytes of disk space tier t can take now: its quota left, within its file
  // system's free space.
  uint64_t room(int t) const;
  // Bytes of disk space all tiers can take now: for the tiers on each file
  // system, their quotas left together, within its free space counted once.
  uint64_t room_all() const;

  int tiers() const { return int(tiers_.size()); }
  uint64_t quota(int t) const { return tiers_[t].quota; }
  uint64_t used(int t) const;
  bool full(int t) const;

 private:
  // REQUIRES mu_: a tier's quota left; the free space left on file system
  // `g` (less the copies in flight to any tier on it, and the reserve).
  uint64_t quota_left_locked(int t) const;
  uint64_t free_left_locked(int g) const;
  uint64_t room_locked(int t) const;  // REQUIRES mu_
  // REQUIRES mu_: the room of all tiers, and each one's in `per_tier`.
  uint64_t room_all_locked(std::vector<uint64_t>* per_tier = nullptr) const;
  std::vector<Tier> tiers_;
  std::function<uint64_t(int)> free_bytes_;
  uint64_t reserve_;
  mutable std::mutex mu_;
  std::vector<uint64_t> used_;      // complete and reserved bytes
  std::vector<uint64_t> inflight_;  // reserved, not yet written
  std::vector<bool> full_;
  std::vector<std::vector<int>> by_fs_;  // the tiers, grouped by file system
  std::vector<int> group_;               // each tier's group in by_fs_
};

}  // namespace monarch
