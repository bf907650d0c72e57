// The stagers of one job talking to each other: a request/response transport
// over UCX (TCP here, InfiniBand/RoCE verbs on clusters that have them, chosen
// by UCX). Only the stagers link it: UCX is not fork-safe, and the processes
// of a job (which fork DataLoader workers) never talk to another node.
//
// One Peers per stager: it listens on an address (UCX's sockaddr connection
// manager) and calls other stagers' listeners. It owns one UCX context and
// worker, driven by its own progress thread; no UCX call is made from any
// other thread, so callers and handlers never touch UCX and need no locks.
//
// A job's stagers share a secret key, which never leaves the process: every
// request carries a fresh 64-bit nonce and HMAC-SHA256(key, "monarch-request",
// nonce, destination, request bytes), the destination being the host name the
// caller asked for, checked against the server's own `identity`. A request
// that does not verify (another key, or meant for another stager) is answered
// `refused` and its connection closed, so another job's or user's stager on
// the same node, or a process that took the job's port first, learns nothing
// it could replay elsewhere. Every answer's header carries HMAC-SHA256(key,
// "monarch-answer", the request's nonce, call id, answer code, payload length);
// a caller takes an answer only from the connection its request went out on,
// only if that verifies, and only up to the length it allows. The payload
// itself is not covered: its integrity is the network's (TCP's, or the
// fabric's), as for the rest of the cluster's traffic; secrecy is not
// provided (file bytes travel in clear, as they do from the PFS).
//
// Transports: UCX picks the fastest it finds, except shared memory, which
// only works between processes of one IPC namespace and is never the path
// between nodes. The environment's UCX_* variables (UCX_TLS, UCX_NET_DEVICES,
// ...) override this, as UCX documents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace monarch::peers {

enum class Code {
  ok,
  timeout,      // no answer by the deadline (peer hung, stopped, slow, or unreachable silently)
  unreachable,  // no connection, or it broke (peer dead, restarted, network down)
  refused,      // the peer does not hold this job's key or is not the stager asked for (or
                // its answer is not signed with the key: not a stager of this job)
  error,        // the peer's handler failed or dropped the request; local errors
};
const char* to_string(Code code);

struct Status {
  Code code = Code::ok;
  std::string text;  // for people: what failed and where; empty when ok
  bool ok() const { return code == Code::ok; }
};

namespace detail {
struct Engine;
}

// The answer to one request, handed to the handler. Move-only; exactly one
// of send() or fail() takes effect, from any thread, at any time later.
// Destroyed without either, it answers fail("dropped without a reply"). If
// the connection is gone or the Peers stopped, the answer is discarded.
class Reply {
 public:
  Reply() = default;
  Reply(Reply&& other) noexcept;
  Reply& operator=(Reply&& other) noexcept;
  ~Reply();

  void send(std::vector<char> bytes);
  void fail(std::string text);
  bool pending() const { return armed_; }

 private:
  friend struct detail::Engine;
  void answer(bool ok, std::vector<char> bytes);
  std::weak_ptr<detail::Engine> engine_;
  uint64_t conn_ = 0;
  uint64_t call_ = 0;
  uint64_t nonce_ = 0;  // the request's, which its answer's MAC covers
  bool armed_ = false;  // false: answered, moved from, or default-constructed
};

// Called on the progress thread for each request: it must not block (it
// stalls every transfer of this stager). Slow work (copying a file first)
// moves the Reply to another thread. Exceptions are caught: the Reply,
// destroyed unanswered, reports an error to the caller.
using Handler = std::function<void(std::vector<char> request, Reply reply)>;

class Peers {
 public:
  // Listens on bind_address:port (port 0: any free port; see port()) and
  // starts the progress thread. Null with `error` set when UCX or the listener
  // cannot start. key: the job's secret (any length; it never travels).
  // identity: the name callers pass to call() to reach this stager (its node
  // name); a request signed for another name is refused.
  static std::unique_ptr<Peers> start(const std::string& bind_address, uint16_t port,
                                      std::string key, std::string identity, Handler handler,
                                      std::string& error);
  // Stops the thread and closes every connection. Calls still waiting return
  // `error`; answers not sent yet are discarded. No call() may start after.
  ~Peers();
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

  uint16_t port() const;

  // What call() accepts by default: a 64 MiB block and a header.
  static constexpr size_t kDefaultMaxReply = (size_t{64} << 20) + 64;

  // Sends `request` to the stager listening on host:port (same key, identity
  // `host`) and waits for its answer, which replaces `reply` (its capacity is
  // reused: large answers arrive by rendezvous straight into it). Returns
  // within timeout_ms, whatever the peer does; on failure `reply` is empty.
  // An answer longer than max_reply bytes is `error`, and never allocated.
  // An answer on another connection than the request's, or whose MAC does not
  // verify, is never taken: the first is dropped (the call waits on; someone
  // else's connection cannot end it), the second, arriving on the request's
  // own connection, ends the call `refused` (the peer is not of this job).
  // Safe from any number of threads; one connection per peer is shared by all
  // calls, opened on first use and opened again after it broke.
  // `host` is resolved once per Peers and cached.
  Status call(const std::string& host, uint16_t port, std::string_view request,
              std::vector<char>& reply, int timeout_ms, size_t max_reply = kDefaultMaxReply);

 private:
  explicit Peers(std::shared_ptr<detail::Engine> engine);
  std::shared_ptr<detail::Engine> engine_;
};

// The wire format, two active messages, here for the tests' raw UCX clients
// (which stand in for strangers) and as its documentation. Integers in host
// order (a job's nodes share one architecture); inside MACs, little-endian.
namespace wire {
constexpr unsigned kRequestAm = 1;       // header RequestHeader, payload the request
constexpr unsigned kAnswerAm = 2;        // header AnswerHeader, payload the reply or error text
constexpr uint32_t kMagic = 0x4d4e5032;  // "MNP2"
enum : uint32_t { kAnswerOk = 0, kAnswerError = 1, kAnswerRefused = 2 };
struct RequestHeader {
  uint32_t magic;
  uint32_t reserved;      // 0
  uint64_t call;          // the caller's; echoed in the answer
  uint64_t nonce;         // random, one per call
  unsigned char mac[32];  // HMAC-SHA256(key, "monarch-request" nonce len32(dest) dest request)
};
struct AnswerHeader {
  uint32_t magic;
  uint32_t answer;
  uint64_t call;
  unsigned char mac[32];  // HMAC-SHA256(key, "monarch-answer" nonce call answer32 length64)
};
}  // namespace wire

}  // namespace monarch::peers
