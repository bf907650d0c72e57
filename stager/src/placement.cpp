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
      full_(tiers_.size()),
      group_(tiers_.size()) {
  for (int t = 0; t < int(tiers_.size()); ++t) {
    auto same = [&](const std::vector<int>& g) {
      return tiers_[t].fs != 0 && tiers_[g.front()].fs == tiers_[t].fs;
    };
    auto it = std::find_if(by_fs_.begin(), by_fs_.end(), same);
    if (it == by_fs_.end()) it = by_fs_.insert(by_fs_.end(), std::vector<int>());
    it->push_back(t);
    group_[t] = int(it - by_fs_.begin());
  }
}

uint64_t Placement::footprint(int t, uint64_t size) const {
  uint64_t b = std::max<uint64_t>(tiers_[t].block, 1);
  return (size + b - 1) / b * b;
}

int Placement::reserve(uint64_t size, uint64_t keep) {
  std::lock_guard lock(mu_);
  std::vector<uint64_t> room(tiers());
  uint64_t total = room_all_locked(&room);
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

uint64_t Placement::quota_left_locked(int t) const {
  return full_[t] || used_[t] >= tiers_[t].quota ? 0 : tiers_[t].quota - used_[t];
}

uint64_t Placement::free_left_locked(int g) const {
  uint64_t taken = reserve_;
  for (int t : by_fs_[g]) taken += inflight_[t];
  uint64_t free = free_bytes_(by_fs_[g].front());
  return free > taken ? free - taken : 0;
}

uint64_t Placement::room_locked(int t) const {
  uint64_t quota = quota_left_locked(t);
  return quota ? std::min(quota, free_left_locked(group_[t])) : 0;
}

uint64_t Placement::room_all_locked(std::vector<uint64_t>* per_tier) const {
  uint64_t room = 0;
  for (int g = 0; g < int(by_fs_.size()); ++g) {
    uint64_t quota = 0, free = free_left_locked(g);  // one statvfs a file system
    for (int t : by_fs_[g]) {
      uint64_t left = quota_left_locked(t);
      quota += left;
      if (per_tier) (*per_tier)[t] = std::min(left, free);
    }
    room += std::min(quota, free);
  }
  return room;
}

uint64_t Placement::room(int t) const {
  std::lock_guard lock(mu_);
  return room_locked(t);
}

uint64_t Placement::room_all() const {
  std::lock_guard lock(mu_);
  return room_all_locked();
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
