#include "size_order.h"

#include <cstring>

namespace monarch {

void SizeOrder::reset(const Entry* entries, uint64_t n, const std::vector<bool>& member) {
  class_.assign(n, kNotHeld);
  class_.shrink_to_fit();
  count_ = {};
  for (uint64_t i = 0; i < n; ++i) {
    if (!member.empty() && !member[i]) continue;
    int c = size_class(entries[i].size);
    class_[i] = uint8_t(c);
    ++count_[c];
  }
  rewind();
}

int64_t SizeOrder::current() {
  for (; cls_ < kClasses; ++cls_, id_ = 0) {
    if (!count_[cls_] || id_ >= class_.size()) continue;
    const void* at = std::memchr(class_.data() + id_, cls_, class_.size() - id_);
    if (at) {
      id_ = uint64_t(static_cast<const uint8_t*>(at) - class_.data());
      return int64_t(id_);
    }
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
