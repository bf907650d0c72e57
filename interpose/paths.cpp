#include "paths.h"

#include <limits.h>

#include <cstring>

namespace monarch {
namespace {

// Walks `path` one component at a time. `abs` always holds the absolute path
// of the directory reached so far (without a trailing '/'; "" is "/").
class Walk {
 public:
  Walk(const JobMap& m, const Views& v) : m_(m), v_(v) {}

  Resolved run(std::string_view path, std::string_view cwd) {
    if (path.empty() || path.size() >= PATH_MAX) return {};
    if (path[0] != '/') {
      if (cwd.empty() || cwd[0] != '/' || cwd.size() >= PATH_MAX) return {};
      while (cwd.size() > 1 && cwd.back() == '/') cwd.remove_suffix(1);
      if (cwd != "/") append(std::string_view(cwd.data() + 1, cwd.size() - 1));
      if (!settle()) return {Where::kUnsure};
    }
    bool trailing = path.back() == '/';
    size_t at = 0;
    std::string_view comp = next(path, at);
    while (!comp.empty()) {
      std::string_view after = next(path, at);
      bool last = after.empty();
      if (!inside_) {
        if (comp == "..") {
          if (!physical_) return {Where::kUnsure};  // ".." after a name that may be a link
          pop();
        } else if (comp != ".") {
          append(comp);
          physical_ = false;
        }
        if (!enter()) return {};
      } else if (comp == "..") {
        if (n_ > base_) {
          pop();  // an indexed directory: a real one, whose parent is the lexical one
        } else if (via_real_) {
          // The root reached by a physical view: its parent is the lexical one too.
          inside_ = false;
          physical_ = true;
          pop();
          if (!enter()) return {};
        } else {
          return {Where::kUnsure};  // the root named through a link: its parent is elsewhere
        }
      } else if (comp != ".") {
        if (!append(comp)) return {Where::kUnsure};
        std::string_view rel = this->rel();
        if (last && !trailing) {
          int64_t f = m_.find(rel);
          if (f >= 0) return {Where::kFile, uint32_t(f), view_};
          int64_t d = dir(rel);
          if (d >= 0) return {Where::kDir, uint32_t(d), view_};
          return {Where::kUnsure};  // not indexed: a link, a new file, nothing...
        }
        if (dir(rel) < 0) return {Where::kUnsure};  // must be a directory the index knows
      }
      comp = after;
    }
    if (!inside_) return {};
    if (n_ == base_) return {Where::kDir, kRoot, view_};
    int64_t d = dir(rel());
    return d >= 0 ? Resolved{Where::kDir, uint32_t(d), view_} : Resolved{Where::kUnsure};
  }

 private:
  // The next non-empty component from `at`; empty at the end.
  static std::string_view next(std::string_view path, size_t& at) {
    while (at < path.size() && path[at] == '/') ++at;
    size_t end = path.find('/', at);
    if (end == std::string_view::npos) end = path.size();
    std::string_view c(path.data() + at, end - at);  // not substr: its check throws
    at = end;
    return c;
  }

  bool append(std::string_view comp) {
    if (n_ + 1 + comp.size() >= sizeof abs_) return false;
    abs_[n_++] = '/';
    std::memcpy(abs_ + n_, comp.data(), comp.size());
    n_ += comp.size();
    return true;
  }
  void pop() {
    while (n_ > 0 && abs_[n_ - 1] != '/') --n_;
    if (n_ > 0) --n_;
  }
  std::string_view abs() const { return {abs_, n_}; }
  std::string_view rel() const {
    return n_ > base_ ? std::string_view(abs_ + base_ + 1, n_ - base_ - 1) : std::string_view();
  }
  int64_t dir(std::string_view rel) const {
    int64_t d = m_.find_dir(rel);
    return d >= 0 && !m_.dir(uint32_t(d)).stale.load(std::memory_order_relaxed) ? d : -1;
  }

  // Outside the dataset: is the directory reached its root? (Always true:
  // returns so that a caller may stop.)
  bool enter() {
    std::string_view a = abs();
    for (int i = 0; i < v_.n; ++i) {
      if (a != v_.v[i].path) continue;
      inside_ = true;
      via_real_ = v_.v[i].physical;
      base_ = n_;
      view_ = uint8_t(i);
      if (via_real_) break;  // a physical one wins: ".." from it is exact
    }
    return true;
  }

  // A relative path starts in the physical current directory: it may already
  // be inside the dataset (below a physical view), in a directory the index
  // must know.
  bool settle() {
    std::string_view a = abs();
    for (int i = 0; i < v_.n; ++i) {
      std::string_view real = v_.v[i].path;
      if (v_.v[i].physical && a.size() > real.size() && a.compare(0, real.size(), real) == 0 &&
          a[real.size()] == '/') {
        inside_ = via_real_ = true;
        base_ = real.size();
        view_ = uint8_t(i);
        return dir(rel()) >= 0;
      }
    }
    enter();
    return true;
  }

  const JobMap& m_;
  const Views& v_;
  char abs_[2 * PATH_MAX + 2];
  size_t n_ = 0;
  size_t base_ = 0;       // inside: length of abs_ at the dataset root
  bool physical_ = true;  // outside: abs_ is a physical path, so ".." may remove a component
  bool inside_ = false;
  bool via_real_ = false;  // inside: the root was reached by its real path
  uint8_t view_ = 0;       // inside: through which view
};

}  // namespace

Resolved resolve(const JobMap& m, const Views& views, std::string_view path, std::string_view cwd) {
  return Walk(m, views).run(path, cwd);
}

}  // namespace monarch
