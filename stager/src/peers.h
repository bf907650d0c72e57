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
// What is authenticated. A job's stagers share a secret key, which never
// leaves the process. Nothing is allocated or computed for a peer before it
// passes these checks, in this order:
// 1. Connection: the caller's address must be one of the job's nodes
//    (Options::hosts, when given) and its connection request must carry the
//    job's connection token (connect_token(key): 64 bits derived from the key,
//    sent in clear; it keeps out whoever never saw a connection of the job, a
//    process that took the job's port first sees it). Others are rejected
//    before UCX makes an endpoint.
// 2. Challenge: on accepting, the server sends a fresh random 128-bit nonce;
//    the caller sends no request before it has it.
// 3. Request: a fixed header and at most kMaxRequest bytes, never received by
//    rendezvous (anything else closes the connection unread). Its MAC,
//    HMAC-SHA256(key, "monarch-request" nonce seq call len32(dest) dest
//    request), covers the connection's nonce, a per-connection sequence number
//    (fresh within a sliding window of 64: a replayed request is refused, on
//    its connection or any other) and the name the caller asked for, checked
//    against the server's `identity` (a request meant for another stager is
//    refused). A request that fails is answered `refused` and its connection
//    closed. Only then is the handler called.
// 4. Answer: HMAC-SHA256(key, "monarch-answer" nonce seq call answer32
//    length64 payload) covers the whole answer. A caller takes an answer only
//    from the connection its request went out on, receives at most max_reply
//    bytes of it, and verifies the MAC (on its own thread) before it takes a
//    byte: a squatter's or tampered answer is `refused`.
// Secrecy is not provided (file bytes travel in clear, as from the PFS).
//
// Known limit: the listener is UCX's TCP connection manager, and UCX 1.13.1
// (Debian 12) aborts the process on malformed connection data (64 bytes of
// plain TCP) or fast connection churn (a stale event on a reused descriptor,
// fixed upstream by openucx/ucx#11458), before any check above runs: whoever
// can reach the port can stop this stager (its node then reads the PFS).
//
// Bounds (Limits): connections not yet authenticated (no valid request yet)
// per source address and in all, the oldest dropped for a new one, and each
// dropped after auth_ms; authenticated ones per source address (the oldest
// goes); requests being served per connection (past it: answered `error`).
// What a connection with the token but without the key can make this process
// hold is what UCX assembles of one eager message before the handler sees
// (and refuses) it: its size is the sender's, so the token is what keeps that
// to the job's own stagers and squatters. MACs of requests are computed on
// the progress thread (a bounded header and at most kMaxRequest bytes, one
// failure per connection); those of answers on the handler's and the caller's
// threads.
//
// Transports: UCX picks the fastest it finds, except shared memory, which
// only works between processes of one IPC namespace and is never the path
// between nodes. The environment's UCX_* variables (UCX_TLS, UCX_NET_DEVICES,
// ...) override this, as UCX documents.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace monarch::peers {

enum class Code {
  ok,
  timeout,      // no answer by the deadline (peer hung, stopped, slow, or unreachable silently)
  unreachable,  // no connection, or it broke (peer dead, restarted, network down, or it
                // rejected this connection: not the job's address or token)
  refused,      // the peer does not hold this job's key or is not the stager asked for (or
                // its answer is not signed with the key: not a stager of this job)
  error,        // the peer's handler failed or dropped the request, or it is busy; local errors
};
const char* to_string(Code code);

struct Status {
  Code code = Code::ok;
  std::string text;  // for people: what failed and where; empty when ok
  bool ok() const { return code == Code::ok; }
};

using Nonce = std::array<unsigned char, 16>;
using Mac = std::array<unsigned char, 32>;

namespace detail {
struct Engine;
}

// The answer to one request, handed to the handler. Move-only; exactly one
// of send() or fail() takes effect, from any thread, at any time later (its
// MAC is computed on that thread). Destroyed without either, it answers
// fail("dropped without a reply"). If the connection is gone or the Peers
// stopped, the answer is discarded.
class Reply {
 public:
  Reply() = default;
  Reply(Reply&& other) noexcept;
  Reply& operator=(Reply&& other) noexcept;
  ~Reply();

  // hold is kept until UCX is done with the bytes (sent, failed or
  // discarded): its owner can count answers in flight.
  void send(std::vector<char> bytes, std::shared_ptr<void> hold = {});
  void fail(std::string text);
  bool pending() const { return armed_; }

 private:
  friend struct detail::Engine;
  void answer(uint32_t code, std::vector<char> bytes, std::shared_ptr<void> hold);
  std::weak_ptr<detail::Engine> engine_;
  uint64_t conn_ = 0;
  uint64_t call_ = 0;
  uint64_t seq_ = 0;    // the request's, which its answer's MAC covers
  Nonce nonce_{};       // the connection's
  bool armed_ = false;  // false: answered, moved from, or default-constructed
};

// Called on the progress thread for each authenticated request: it must not
// block (it stalls every transfer of this stager). Slow work (copying a file
// first) moves the Reply to another thread. Exceptions are caught: the Reply,
// destroyed unanswered, reports an error to the caller.
using Handler = std::function<void(std::vector<char> request, Reply reply)>;

struct Limits {
  unsigned unauthenticated_per_source = 4;  // connections without a valid request yet, one address
  unsigned unauthenticated = 16;            // the same, all addresses
  unsigned authenticated_per_source = 8;    // a restarted stager's new one replaces the oldest
  unsigned in_flight = 64;                  // requests of one connection being served
  unsigned auth_ms = 3000;                  // a connection silent or invalid this long is dropped
};

struct Options {
  // Where to listen: an IPv4 address or a name resolved to one; empty: all
  // of the node's (0.0.0.0). Port 0: any free port (see port()).
  std::string bind_address;
  uint16_t port = 0;
  std::string key;       // the job's secret (any length; it never travels)
  std::string identity;  // the name callers pass to call() to reach this stager
  // The job's nodes: name -> IPv4 address (numeric). call() uses these and
  // never resolves these names; when not empty, connections are accepted only
  // from these addresses.
  std::map<std::string, std::string> hosts;
  Limits limits;
};

class Peers {
 public:
  // Listens and starts the progress thread. Null with `error` set when UCX
  // or the listener cannot start.
  static std::unique_ptr<Peers> start(Options options, Handler handler, std::string& error);
  // Stops the thread and closes every connection. Calls still waiting return
  // `error`; answers not sent yet are discarded. No call() may start after.
  ~Peers();
  Peers(const Peers&) = delete;
  Peers& operator=(const Peers&) = delete;

  uint16_t port() const;

  // What call() accepts by default: a 64 MiB block and a header.
  static constexpr size_t kDefaultMaxReply = (size_t{64} << 20) + 64;

  // Sends `request` (at most kMaxRequest bytes, else `error`) to the stager
  // listening on host:port (same key, identity `host`) and waits for its
  // answer, which replaces `reply` (its capacity is reused: large answers
  // arrive by rendezvous straight into it). Returns within timeout_ms,
  // whatever the peer does; on failure `reply` is empty. An answer longer than
  // max_reply bytes is `error`, and never allocated. An answer on another
  // connection than the request's is dropped (the call waits on: someone
  // else's connection cannot end it); one on the request's own connection
  // whose MAC does not verify ends the call `refused`. Safe from any number
  // of threads; one connection per peer is shared by all calls, opened on
  // first use and opened again after it broke. `host` is looked up in
  // Options::hosts, else resolved once per Peers and cached.
  Status call(const std::string& host, uint16_t port, std::string_view request,
              std::vector<char>& reply, int timeout_ms, size_t max_reply = kDefaultMaxReply);

 private:
  explicit Peers(std::shared_ptr<detail::Engine> engine);
  std::shared_ptr<detail::Engine> engine_;
};

// The wire format: three active messages, here for the tests' raw UCX clients
// (which stand in for strangers), the fuzz test, and as its documentation.
// Integers in host order (a job's nodes share one architecture); inside MACs,
// little-endian. The decoders are pure: any bytes in, a verdict out.
namespace wire {
constexpr unsigned kRequestAm = 1;       // header RequestHeader, payload the request
constexpr unsigned kAnswerAm = 2;        // header AnswerHeader, payload the reply or error text
constexpr unsigned kChallengeAm = 3;     // header Challenge, no payload: server to caller, once
constexpr uint32_t kMagic = 0x4d4e5033;  // "MNP3"
constexpr size_t kMaxRequest = 256;      // a request's payload, at most
enum : uint32_t { kAnswerOk = 0, kAnswerError = 1, kAnswerRefused = 2 };
struct Challenge {
  uint32_t magic;
  uint32_t reserved;  // 0
  Nonce nonce;        // random, one per connection
};
struct RequestHeader {
  uint32_t magic;
  uint32_t reserved;  // 0
  uint64_t call;      // the caller's; echoed in the answer
  uint64_t seq;       // 1, 2, ... on each connection
  Mac mac;            // request_mac()
};
struct AnswerHeader {
  uint32_t magic;
  uint32_t answer;
  uint64_t call;
  Mac mac;  // answer_mac()
};

bool request_mac(std::string_view key, const Nonce& nonce, uint64_t seq, uint64_t call,
                 std::string_view destination, std::string_view request, Mac& out);
bool answer_mac(std::string_view key, const Nonce& nonce, uint64_t seq, uint64_t call,
                uint32_t answer, std::string_view payload, Mac& out);
uint64_t connect_token(std::string_view key);
bool same_mac(const Mac& a, const Mac& b);  // in constant time

// A request as it arrived: header bytes, payload length, whether UCX offers
// it by rendezvous. False and why when it is not one to verify.
bool decode_request(const void* header, size_t header_length, size_t length, bool rndv,
                    RequestHeader& out, std::string& why);
bool decode_answer(const void* header, size_t header_length, AnswerHeader& out);
bool decode_challenge(const void* header, size_t header_length, size_t length, Challenge& out);

// The sequence numbers a connection has used: fresh() for one not used and
// not older than the 64 before the highest.
struct Window {
  uint64_t top = 0;   // the highest taken
  uint64_t seen = 0;  // bit i: top - i taken
  bool fresh(uint64_t seq) const;
  void take(uint64_t seq);
};
}  // namespace wire

}  // namespace monarch::peers
