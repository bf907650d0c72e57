// What every fuzz target shares: the entry point libFuzzer calls (or, in the
// normal build, driver.cpp, which calls it once per file), a check that
// stops the process with the failed condition (libFuzzer then keeps the
// input), and a reader of typed values from the input's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// Not assert(): it stays in every build type.
#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace monarch::fuzz {

// Values taken from the front of the input, in order; past its end, zeros
// and empty strings (an input of any length is a valid one).
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(reinterpret_cast<const char*>(data)), n_(size) {}
  template <typename T>
  T take() {
    T v{};
    size_t k = n_ < sizeof v ? n_ : sizeof v;
    std::memcpy(&v, p_, k);
    p_ += k, n_ -= k;
    return v;
  }
  // A string up to the next `end` byte (taken), or the rest.
  std::string_view until(char end) {
    const void* e = n_ ? std::memchr(p_, end, n_) : nullptr;
    size_t k = e ? size_t(static_cast<const char*>(e) - p_) : n_;
    std::string_view s(p_, k);
    p_ += k + (e ? 1 : 0), n_ -= k + (e ? 1 : 0);
    return s;
  }
  std::string_view rest() {
    std::string_view s(p_, n_);
    p_ += n_, n_ = 0;
    return s;
  }
  size_t left() const { return n_; }

 private:
  const char* p_;
  size_t n_;
};

}  // namespace monarch::fuzz
