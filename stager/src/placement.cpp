#include "placement.h"

#include <algorithm>

namespace monarch {

Placement::Placement(std::vector<Tier> tiers, std::function<uint64_t(int)> free_bytes,
                     uint64_t reserve)
    : tiers_(std::move(tiers)),
      free_bytes_(std::move(free_bytes)),
      reserve_(reserve),
      used_(tiers_.size()),
      inflight_(tiers_.size()),
      full_(tiers_.size()) {}

uint64_t Placement::footprint(int t, uint64_t size) const {
  uint64_t b = std::max<uint64_t>(tiers_[t].block, 1);
  return (size + b - 1) / b * b;
}

int Placement::reserve(uint64_t size, uint64_t keep) {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> room(tiers());
  uint64_t total = 0;
  for (int t = 0; t < tiers(); ++t) {
    room[t] = room_locked({&t, 1});
    total += room[t];
  }
  for (int t = 0; t < tiers(); ++t) {
    uint64_t need = footprint(t, size);
    if (room[t] < need || total - need < keep) continue;
    used_[t] += need;
    inflight_[t] += need;
    return t;
  }
  return -1;
}

void Placement::written(int t, uint64_t size) {
  std::lock_guard lock(mu_);
  inflight_[t] -= std::min(inflight_[t], footprint(t, size));
}

void Placement::release(int t, uint64_t size) {
  std::lock_guard lock(mu_);
  uint64_t need = footprint(t, size);
  inflight_[t] -= std::min(inflight_[t], need);
  used_[t] -= std::min(used_[t], need);
}

void Placement::adopt(int t, uint64_t size) {
  std::lock_guard lock(mu_);
  used_[t] += footprint(t, size);
}

void Placement::mark_full(int t) {
  std::lock_guard lock(mu_);
  full_[t] = true;
}

uint64_t Placement::room_locked(std::span<const int> ts) const {
  if (ts.empty()) return 0;
  uint64_t quota = 0, taken = reserve_;
  for (int t : ts) {
    if (!full_[t] && used_[t] < tiers_[t].quota) quota += tiers_[t].quota - used_[t];
    taken += inflight_[t];
  }
  if (quota == 0) return 0;
  uint64_t free = free_bytes_(ts.front());
  return std::min(quota, free > taken ? free - taken : 0);
}

uint64_t Placement::room(int t) const {
  std::lock_guard lock(mu_);
  return room_locked({&t, 1});
}

uint64_t Placement::room_shared(std::span<const int> ts) const {
  std::lock_guard lock(mu_);
  return room_locked(ts);
}

uint64_t Placement::used(int t) const {
  std::lock_guard lock(mu_);
  return used_[t];
}

bool Placement::full(int t) const {
  std::lock_guard lock(mu_);
  return full_[t];
}

}  // namespace monarch
