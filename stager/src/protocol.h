// Messages from the processes of a job to their stager: one fixed-size
// datagram each, on the Unix socket <job dir>/ctl.sock. Senders never wait for
// an answer: the answer is the file's state word in the job map (kPeerRead
// alone is answered, on a stream socket of its own).
#pragma once

#include <signal.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>

namespace monarch {

// A stager is stopped by SIGTERM (SIGINT and SIGHUP too), taken with
// sigwait. Its launcher keeps them blocked across exec, so that one sent
// while the stager starts waits for it instead of ending it unprepared.
inline sigset_t stager_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
  return set;
}

enum class Request : uint32_t {
  kPlace = 1,     // copy this file soon: a reader is reading it now
  kData = 2,      // the file's bytes, read whole: SCM_RIGHTS carries exactly two descriptors,
                  // a memfd with the bytes and the reader's own descriptor of the PFS file
                  // they were read from (the proof of where they come from)
  kStale = 3,     // the PFS file no longer matches the index, or the job opened it to write
  kRelease = 4,   // a claim (kClaimed) was given up: the file is free to copy
  kPeerRead = 5,  // a multi-node job, no room here for the file: read [off, off + len) of it
                  // from another node and answer on the stream socket SCM_RIGHTS carries
                  // (exactly one): an int64 n, then n bytes (n < 0: read the PFS)
};

struct Message {
  uint32_t magic = kMessageMagic;
  Request type;
  uint64_t generation;  // of the job map the sender uses; others are ignored
  uint32_t file;
  int32_t pid;
  uint64_t off = 0, len = 0;                             // kPeerRead
  static constexpr uint32_t kMessageMagic = 0x4d4f4e31;  // "MON1"
};
static_assert(sizeof(Message) == 40, "no padding: every byte of a datagram is a field");

// A datagram as the stager received it: its bytes (at most sizeof(Message)
// are read), whether the kernel cut it or its descriptors (MSG_TRUNC,
// MSG_CTRUNC), and how many descriptors came with it. True when the stager
// acts on it, with the message in `out`: one whole Message, of the job map
// of `generation`, naming a file below `files`, of a type the stager serves,
// with exactly the descriptors that type carries (kData two, kPeerRead one
// and only when `peer_reads`, the others none). The descriptors of any
// other datagram are closed unused.
inline bool decode_message(const void* bytes, size_t length, bool truncated, size_t fds,
                           uint64_t generation, uint64_t files, bool peer_reads, Message& out) {
  if (length != sizeof out || truncated) return false;
  std::memcpy(&out, bytes, sizeof out);
  if (out.magic != Message::kMessageMagic || out.generation != generation || out.file >= files)
    return false;
  switch (out.type) {
    case Request::kData:
      return fds == 2;
    case Request::kPeerRead:
      return fds == 1 && peer_reads;
    case Request::kPlace:
    case Request::kStale:
    case Request::kRelease:
      return fds == 0;
  }
  return false;
}

}  // namespace monarch
