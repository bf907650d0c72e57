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
// A job's stagers share a secret key. Every request carries it; a connection
// whose request carries another key is answered `refused` and closed, so
// another job's or user's stager on the same node cannot talk to this one.
//
// Transports: UCX picks the fastest it finds, except shared memory, which
// only works between processes of one IPC namespace and is never the path
// between nodes. The environment's UCX_* variables (UCX_TLS, UCX_NET_DEVICES,
// ...) override this, as UCX documents.
#pragma once

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
  refused,      // the peer does not accept this job's key
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
  // cannot start. key: the job's secret, at most 256 bytes.
  static std::unique_ptr<Peers> start(const std::string& bind_address, uint16_t port,
                                      std::string key, Handler handler, std::string& error);
  // Stops the thread and closes every connection. Calls still waiting return
  // `error`; answers not sent yet are discarded. No call() may start after.
  ~Peers();
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

  uint16_t port() const;

  // Sends `request` to the stager listening on host:port (same key) and waits
  // for its answer, which replaces `reply` (its capacity is reused: large
  // answers arrive by rendezvous straight into it). Returns within
  // timeout_ms, whatever the peer does; on failure `reply` is empty. Safe
  // from any number of threads; one connection per peer is shared by all
  // calls, opened on first use and opened again after it broke.
  // `host` is resolved once per Peers and cached.
  Status call(const std::string& host, uint16_t port, std::string_view request,
              std::vector<char>& reply, int timeout_ms);

 private:
  explicit Peers(std::shared_ptr<detail::Engine> engine);
  std::shared_ptr<detail::Engine> engine_;
};

}  // namespace monarch::peers
