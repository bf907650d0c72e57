// Fd: one owned file descriptor, closed when its owner goes. Move-only, so
// a descriptor has exactly one owner and no path forgets to close it.
// Closing keeps errno, so an error can be reported after the cleanup.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace monarch {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(other.release()) {}
  Fd& operator=(Fd&& other) noexcept {
    reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  // Gives the descriptor up without closing it.
  int release() { return std::exchange(fd_, -1); }
  // Closes the descriptor held, if any, and holds `fd` instead.
  void reset(int fd = -1) {
    if (fd_ >= 0) {
      int saved = errno;
      ::close(fd_);
      errno = saved;
    }
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// pread and pwrite of all `len` bytes at `off`, EINTR retried: the bytes
// done, fewer at an error (errno says which), at the end of the file
// (pread), or when nothing could be written (pwrite: errno ENOSPC).
inline size_t pread_full(int fd, void* buf, size_t len, uint64_t off) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, static_cast<char*>(buf) + done, len - done, off_t(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += size_t(n);
  }
  return done;
}
inline size_t pwrite_full(int fd, const void* buf, size_t len, uint64_t off) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pwrite(fd, static_cast<const char*>(buf) + done, len - done, off_t(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = ENOSPC;
    if (n <= 0) break;
    done += size_t(n);
  }
  return done;
}

}  // namespace monarch
