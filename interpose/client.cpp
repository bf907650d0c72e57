#include "client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fdtable.h"
#include "handlers.h"
#include "mappings.h"
#include "paths.h"
#include "process.h"

namespace monarch {

bool send(JobMap* m, Request type, uint32_t file, const int* fds, int nfds, uint64_t off,
          uint64_t len) {
  if (!P.addr_len) return false;
  int saved = errno;
  int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  bool ok = false;
  if (s >= 0) {
    Message msg{.type = type,
                .generation = m->generation(),
                .file = file,
                .pid = P.pid.load(),
                .off = off,
                .len = len};
    iovec iov{&msg, sizeof msg};
    msghdr mh{.msg_name = &P.addr, .msg_namelen = P.addr_len, .msg_iov = &iov, .msg_iovlen = 1};
    alignas(cmsghdr) char cbuf[CMSG_SPACE(2 * sizeof(int))];
    if (nfds > 0 && nfds <= 2) {
      mh.msg_control = cbuf;
      mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
      std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    }
    ok = sendmsg(s, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) == ssize_t(sizeof msg);
    real::close(s);
  }
  errno = saved;
  return ok;
}

namespace {

constexpr uint64_t kPeerReadWaitNs = 60'000'000'000;

// Waits until `fd` can be read, while the stager lives: false when it died,
// hangs (its heartbeat stops) or the wait passed kPeerReadWaitNs.
bool wait_readable(JobMap* m, int fd, uint64_t start) {
  for (;;) {
    pollfd p{.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, 100);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
    uint64_t now = monotonic_ns();
    if (!m->stager_alive(now) || now - start > kPeerReadWaitNs) return false;
  }
}

// Reads exactly n bytes into buf; false at an early end or an error.
bool read_exact(JobMap* m, int fd, void* buf, size_t n, uint64_t start) {
  for (size_t got = 0; got < n;) {
    if (!wait_readable(m, fd, start)) return false;
    ssize_t r = real::read(fd, static_cast<char*>(buf) + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += size_t(r);
  }
  return true;
}

}  // namespace

ssize_t peer_read(JobMap* m, uint32_t file, uint64_t off, uint64_t len, const iovec* iov, int cnt) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -2;
  bool sent = send(m, Request::kPeerRead, file, &sv[1], 1, off, len);
  real::close(sv[1]);
  uint64_t start = monotonic_ns();
  int64_t n = -1;
  ssize_t result = -2;
  if (sent && read_exact(m, sv[0], &n, sizeof n, start) && n >= 0 && uint64_t(n) <= len) {
    // Straight into the caller's vector: a bad buffer is the read's EFAULT.
    uint64_t left = uint64_t(n);
    for (int i = 0; i < cnt && left > 0 && result == -2; ++i) {
      size_t part = size_t(std::min<uint64_t>(left, iov[i].iov_len));
      size_t got = 0;
      while (got < part) {
        if (!wait_readable(m, sv[0], start)) break;
        ssize_t r = real::read(sv[0], static_cast<char*>(iov[i].iov_base) + got, part - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && errno == EFAULT) result = -1;
        if (r <= 0) break;
        got += size_t(r);
      }
      if (got < part) break;
      left -= part;
    }
    if (result == -2 && left == 0) result = ssize_t(n);
  }
  int saved = errno;
  real::close(sv[0]);
  errno = saved;
  return result;
}

namespace {
// Marks one file stale in the map; true when this call changed the word.
bool stale_word(JobMap* m, uint32_t file, Change change) {
  std::atomic<uint32_t>& w = m->entry(file).state;
  uint32_t names = change == Change::kNames ? kNamesOnly : 0;
  for (;;) {
    uint32_t old = w.load();
    uint32_t want;
    if (state_of(old) == kStale) {  // already: only "bytes changed" can be added
      if (!(aux_of(old) & kNamesOnly) || names) return false;
      want = make_state(kStale, tier_of(old), aux_of(old) & ~kNamesOnly);
    } else {
      State s = m->decode(old);
      // A copy to delete keeps its tier in the word; the stager deletes it.
      want = s.state == kCached ? make_state(kStale, s.tier, kCopyToDelete | names)
                                : make_state(kStale, 0, names);
    }
    if (w.compare_exchange_weak(old, want)) return true;
  }
}
}  // namespace

void mark_stale(JobMap* m, uint32_t file, Change change) {
  if (file >= m->size()) return;
  if (stale_word(m, file, change)) {
    // This process's mappings of it moved to its copy go back to the PFS file
    // now, before the change; the other processes' at their next call.
    if (change == Change::kBytes) maps_stale(m, file);
    m->header().copies_changed.fetch_add(1, std::memory_order_release);
    add(m, c_fb_stale);
    send(m, Request::kStale, file);
    note("%.*s changed by the job: read from the PFS from now on", int(m->path(file).size()),
         m->path(file).data());
  }
}

void mark_stale_dir(JobMap* m, uint32_t dir, Change change) {
  std::string_view prefix = dir == kRoot ? std::string_view() : m->dir_path(dir);
  if (dir != kRoot) m->dir(dir).stale = 1;
  auto under = [&](std::string_view p) {
    return prefix.empty() ||
           (p.size() > prefix.size() && p.starts_with(prefix) && p[prefix.size()] == '/');
  };
  for (uint64_t d = 0; d < m->dirs(); ++d)
    if (under(m->dir_path(uint32_t(d)))) m->dir(uint32_t(d)).stale = 1;
  // Files are sorted by path (as unsigned bytes): those below `prefix` are
  // one run, from the first path not before prefix + "/". Siblings such as
  // "prefix-x/..." and "prefix.y/..." sort between prefix and prefix + "/".
  auto before_run = [&](std::string_view p) {
    if (int c = p.substr(0, prefix.size()).compare(prefix); c != 0) return c < 0;
    return p.size() == prefix.size() || static_cast<unsigned char>(p[prefix.size()]) < '/';
  };
  uint64_t lo = 0, hi = m->size();
  if (!prefix.empty()) {
    while (lo < hi) {
      uint64_t mid = (lo + hi) / 2;
      if (before_run(m->path(uint32_t(mid))))
        lo = mid + 1;
      else
        hi = mid;
    }
  }
  for (uint64_t f = lo; f < m->size() && under(m->path(uint32_t(f))); ++f)
    if (stale_word(m, uint32_t(f), change)) send(m, Request::kStale, uint32_t(f));
}

void mark_stale_inode(JobMap* m, const struct stat& st, Change change) {
  if (!m->dataset_dev(st.st_dev)) return;
  if (S_ISDIR(st.st_mode)) {
    // A directory changed: which names lead to the files below it, at most.
    int64_t d = m->find_dir_inode(st.st_dev, st.st_ino);
    if (d == JobMap::kRootDir)
      mark_stale_dir(m, kRoot, Change::kNames);
    else if (d >= 0)
      mark_stale_dir(m, uint32_t(d), Change::kNames);
    return;
  }
  m->for_each_inode(st.st_dev, st.st_ino, [&](uint32_t f) { mark_stale(m, f, change); });
}

void touch(JobMap* m, uint32_t file) {
  m->touch(file);
}

bool claim(JobMap* m, uint32_t file, uint32_t& word) {
  uint32_t expect = m->entry(file).state.load();
  if (state_of(expect) != kNone) return false;
  word = make_state(kClaimed, 0, coarse_now());
  return m->entry(file).state.compare_exchange_strong(expect, word);
}

void release(JobMap* m, uint32_t file, uint32_t word) {
  if (m->entry(file).state.compare_exchange_strong(word, make_state(kNone)))
    send(m, Request::kRelease, file);
}

}  // namespace monarch
