#include "size_order.h"

#include <utility>

namespace monarch {

void SizeOrder::reset(const Entry* entries, uint64_t n, std::vector<bool> member) {
  entries_ = entries;
  n_ = n;
  member_ = std::move(member);
  count_ = {};
  for (uint64_t i = 0; i < n_; ++i)
    if (holds(i)) ++count_[size_class(entries_[i].size)];
  rewind();
}

int64_t SizeOrder::current() {
  for (; cls_ < kClasses; ++cls_, id_ = 0) {
    if (!count_[cls_]) continue;
    for (; id_ < n_; ++id_)
      if (holds(id_) && size_class(entries_[id_].size) == cls_) return int64_t(id_);
  }
  return -1;
}

void SizeOrder::advance() {
  if (cls_ < kClasses) ++id_;
}

void SizeOrder::rewind() {
  cls_ = 0;
  id_ = 0;
}

}  // namespace monarch
