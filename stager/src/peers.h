// The stagers of one job talking to each other: a request/response transport
// over UCX (TCP here, InfiniBand/RoCE verbs on clusters that have them, chosen
// by UCX). Only the stagers link it: UCX is not fork-safe, and the processes
// of a job (which fork DataLoader workers) never talk to another node.
//
// One Peers per stager: it listens on a port of the job (its front door, a
// plain TCP listener of ours) and calls other stagers' front doors. It owns
// one UCX context and worker, driven by its own progress thread, which also
// serves the front door; no UCX call is made from any other thread, so
// callers and handlers never touch UCX and need no locks.
//
// The front door. UCX's own sockaddr connection manager is never exposed:
// UCX 1.13.1 (Debian 12) aborts the process on 64 bytes of TCP garbage or
// fast connection churn on it. Instead each call to a stager it has no
// session with starts with a handshake on the front door, three fixed-size
// messages (wire::Hello, Proof, Welcome), done by the calling thread with
// the call's deadline:
// 1. The server, at accept (only from the job's addresses, Options::hosts,
//    when given: others are closed unread), sends a fresh random 128-bit
//    nonce.
// 2. The caller proves the job's key: HMAC-SHA256(key, "monarch-door-caller"
//    server-nonce caller-nonce len32(destination) destination le16(port)
//    len32(caller) caller len32(address) address), where destination is the
//    name it calls (checked against the server's `identity`), port the port
//    it dialed (checked against the one the server listens on: a handshake
//    relayed from another port, a squatted candidate, does not verify),
//    caller its own identity (with Options::hosts, checked: the connection
//    comes from that node's address; a caller calls from the address it
//    listens on, when it listens on one) and address its UCX worker address
//    (at most kMaxAddress bytes).
// 3. The server proves it back: HMAC-SHA256(key, "monarch-door-server" the
//    same fields, then the session id and its own worker address) and hands
//    the caller its worker address and a random 64-bit session id, then
//    closes the door connection. The caller takes neither before the MAC
//    verifies (a squatter on the port is `refused`). A Proof that does not
//    verify is not answered: the connection closes, and the caller, which
//    cannot tell that from a handshake evicted by a flood, calls it
//    `unreachable`.
// Each side then makes its own UCX endpoint to the other's worker address
// (err mode PEER) and sends only on it: requests go caller to server, answers
// server to caller. UCX's reply endpoints are never kept: UCX destroys them
// when their peer fails, at any progress.
//
// What is authenticated over UCX. A job's stagers share a secret key, which
// never leaves the process. A request is served only if:
// - its header names a live session (else it is dropped unread, unanswered:
//   nobody without the session id can make this process answer);
// - it is a fixed header and at most kMaxRequest bytes, never received by
//   rendezvous;
// - its MAC, HMAC-SHA256(key, "monarch-request" nonce seq call
//   len32(destination) destination request), verifies, where nonce is the
//   session's (the server's nonce of its handshake) and seq is fresh within
//   the session's sliding window of 64 (a replayed request is dropped, from
//   any endpoint, and a request of another session does not verify).
// Any other request is dropped unread and unanswered (counted), and the
// session stays: a session id travels in clear, so whoever sends a request
// that does not verify proved nothing; no verdict about it is signed, and it
// cannot end the session of the caller that holds the key. Only a request
// that verifies reaches the handler.
// A caller whose call times out with nothing heard on its session for
// Limits::silent_session_ms or longer (no answer to any call of it) forgets the session and its
// endpoint: the server may have ended it (a restarted caller's newer sessions
// replace its oldest) and never says so; the next call handshakes again.
// Answers: HMAC-SHA256(key, "monarch-answer" nonce seq call answer32 length64
// payload) covers the whole answer. A caller takes an answer only for a call
// it is waiting on, of the session the call went out on (call ids are random
// 64-bit: nobody guesses one), receives at most max_reply bytes of it, and
// verifies the MAC before it takes a byte. An eager answer is verified on
// the progress thread before it touches the call: one that does not verify
// (a stranger who read the call's ids off the network) is dropped, and the
// call waits on for the genuine one. One received by rendezvous is verified
// on the caller's thread, and ends the call `refused` if it does not verify.
// Secrecy is not provided (file bytes travel in clear, as from the PFS), and
// the session ids and worker addresses travel in clear too: whoever reads the
// job's network traffic learns them, and can then reach UCX (see below).
//
// Bounds (Limits). Answers: at most Limits::max_answer bytes each (a larger
// one is refused, `error`, with a log line: a bug of its handler's), and at
// most Limits::answer_bytes of them handed to this Peers and not yet done
// with by UCX (sent, failed or discarded), whoever asks and whether or not
// the caller takes them; past it an answer is sent as a short `busy`
// (the caller asks again later) and its bytes are freed at once. A
// caller that stops taking its answers (its stager stopped, its network
// gone, with no connection failing) holds them until Limits::answer_ms
// passes: then its session ends, and its answers are let go.
// Error texts are not counted in those bytes: one per request served, their
// number is bounded as the requests are. The front door: connections that have not completed the
// handshake, per source address (its oldest dropped for a new one) and in all
// (then the oldest of the address holding the most goes, never a lone
// caller's: when every address holds one, the new one is closed), each
// dropped after auth_ms; each holds at most one Proof (about
// 4 KiB) and one HMAC is computed per completed Proof. Garbage, churn, slow
// or silent connections never reach UCX and cost the progress thread at most
// 64 accepts per turn. Sessions: per source address (the oldest goes: a
// restarted stager's new one replaces it). Requests being served per session
// (past it: answered `error`). MACs of requests are computed on the progress
// thread (a bounded header and at most kMaxRequest bytes, for requests that
// name a live session with a fresh sequence number); those of answers on the handler's and the
// caller's threads. Known limit: UCX's own transport listener (TCP: a random port of the worker)
// takes connections from anyone, and UCX assembles an eager message whole before the handler sees
// and drops it; whoever learns the worker address can make this process hold what UCX holds for
// such messages (tests/unit/peers_test.cpp measures it). UCX keeps such
// connections open a while and drops its listener for good when accept()
// fails at the descriptor limit: Peers::start raises the process's soft
// limit to the hard one, which bounds what such a flood must hold.
//
// Ports. A job's stagers listen on the first free port among
// port_candidates(key, low, high): the configured range in an order drawn
// from the key (HMAC-SHA256(key, "monarch-port-v2" le32(i)) drives a
// Fisher-Yates shuffle), the whole range when it has at most
// kPortCandidates ports, else its first kPortCandidates. The listener logs
// which candidate it took; it fails (the node then caches on its own) only
// when every candidate is taken. A caller tries the candidates in order, at
// most kTriesPerCall a call, each for at most 250 ms (the last one of a call
// for what is left of it), and takes the first whose front door proves the
// key; it remembers per host the one that did (later calls go there first)
// and, when none did, where the next call goes on. Two jobs whose candidates collide on a node,
// another job's stager or a squatter on a candidate, cost a caller at most 250 ms each, once; ports
// are not predictable without the key.
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
  unreachable,  // no connection, or it broke (peer dead, restarted, network down), or the
                // front door closed it before its Welcome (the peer did not take the
                // Proof: another job's key, another name, this node not one of the job's;
                // or a flood evicted the handshake: the caller cannot tell which)
  refused,      // not this job's stager's: a Hello that is not Monarch's, a Welcome or an
                // answer not signed with the key. Whoever reads and writes the job's
                // network can forge one: never a final verdict about a peer
  error,        // the peer's handler failed or dropped the request; local errors
  busy,         // the peer holds as many answers as it may, or serves as many requests of this
                // caller: ask again later
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
  uint64_t session_ = 0;
  uint64_t call_ = 0;
  uint64_t seq_ = 0;    // the request's, which its answer's MAC covers
  Nonce nonce_{};       // the session's
  bool armed_ = false;  // false: answered, moved from, or default-constructed
};

// Called on the progress thread for each authenticated request: it must not
// block (it stalls every transfer of this stager). Slow work (copying a file
// first) moves the Reply to another thread. Exceptions are caught: the Reply,
// destroyed unanswered, reports an error to the caller.
using Handler = std::function<void(std::vector<char> request, Reply reply)>;

// The largest answer by default: a piece of 4 MiB (jobwide.h's kMaxPiece,
// which checks against it) and a header of at most 64 bytes.
inline constexpr size_t kMaxAnswer = (size_t{4} << 20) + 64;

struct Limits {
  unsigned unauthenticated_per_source = 4;  // front door connections in a handshake, one address
  unsigned unauthenticated = 16;            // the same, all addresses
  unsigned authenticated_per_source = 8;    // sessions; a restarted stager's replaces the oldest
  unsigned in_flight = 64;                  // requests of one session being served
  unsigned auth_ms = 3000;                  // a handshake not done this long is dropped
  // A caller forgets a session whose call timed out when nothing was heard
  // on it (no answer to any of its calls) for this long: the server may have
  // ended it without a word. Shorter silences (a busy peer) keep it.
  unsigned silent_session_ms = 1000;
  size_t answer_bytes = size_t{64} << 20;  // answers held at once, in bytes (see Bounds)
  size_t max_answer = kMaxAnswer;          // one answer, in bytes; at most answer_bytes
  // A caller with an answer UCX has not finished sending for this long has
  // stopped taking them: its session ends, freeing its answers (see Bounds).
  unsigned answer_ms = 10000;
};

// Answers handed to a Peers (Reply::send, Reply::fail) and not yet done with
// by UCX: now, and the most at once so far. `bytes` are those of answers
// (error texts not counted), which Limits::answer_bytes bounds; `busy` and
// `too_large` count the answers sent as `error` instead (over answer_bytes,
// over max_answer).
struct Held {
  uint64_t answers = 0, bytes = 0;
  uint64_t peak_answers = 0, peak_bytes = 0;
  uint64_t busy = 0, too_large = 0;
};

struct Options {
  // Where to listen: an IPv4 address or a name resolved to one; empty: all
  // of the node's (0.0.0.0). The port: `port` when not 0; else, with a range
  // (port_high not 0), the first free of port_candidates(key, port_low,
  // port_high); else any free port (see port()).
  std::string bind_address;
  uint16_t port = 0;
  uint16_t port_low = 0, port_high = 0;
  std::string key;       // the job's secret (any length; it never travels)
  std::string identity;  // the name callers pass to call() to reach this stager (<= kMaxIdentity)
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
  // This stager's UCX worker address: what its handshakes send in clear (the
  // tests hand it to strangers, as a listener on the network learns it).
  std::string worker_address() const;

  // Sends `request` (at most kMaxRequest bytes, else `error`) to the stager
  // listening on host:port (same key, identity `host`; port 0: the first of
  // the job's port candidates whose front door proves the key, see Ports) and waits for
  // its answer, which replaces `reply` (its capacity is reused: large answers
  // arrive by rendezvous straight into it). Returns within timeout_ms,
  // whatever the peer does (the handshake included); on failure `reply` is
  // empty. An answer longer than max_reply bytes is `error`, and never
  // allocated. One whose MAC does not verify ends the call `refused`. Safe
  // from any number of threads; one session per peer is shared by all calls,
  // made on first use and made again after it broke or let a call time out
  // with nothing heard. `host` is looked up in Options::hosts and never
  // resolved (a name not there is `unreachable`); only when hosts is empty
  // (tests, a stager run by hand) is it resolved, once per Peers, and cached.
  Status call(const std::string& host, uint16_t port, std::string_view request,
              std::vector<char>& reply, int timeout_ms, size_t max_reply);

  Held held() const;

 private:
  explicit Peers(std::shared_ptr<detail::Engine> engine);
  std::shared_ptr<detail::Engine> engine_;
};

// The wire format: the front door's three messages and two active messages,
// here for the tests' raw clients (which stand in for strangers), the fuzz
// test, and as its documentation. Integers in host order (a job's nodes share
// one architecture); inside MACs, little-endian. The decoders are pure: any
// bytes in, a verdict out.
namespace wire {
constexpr unsigned kRequestAm = 1;       // header RequestHeader, payload the request
constexpr unsigned kAnswerAm = 2;        // header AnswerHeader, payload the reply or error text
constexpr uint32_t kMagic = 0x4d4e5034;  // "MNP4"
constexpr size_t kMaxRequest = 256;      // a request's payload, at most
constexpr size_t kMaxIdentity = 64;      // a stager's name (a node name), at most
constexpr size_t kMaxAddress = 4096;     // a UCX worker address, at most
// A job's ports: a listener can try every candidate (a bind each), a caller
// at most kTriesPerCall a call (up to 250 ms each), so 64 are four calls'
// worth; a node finds all 64 taken only when as many ports of the range are.
constexpr unsigned kPortCandidates = 64;
constexpr unsigned kTriesPerCall = 16;
constexpr unsigned kMinTryMs = 10;  // a candidate's least share of a call
enum : uint32_t { kAnswerOk = 0, kAnswerError = 1, kAnswerBusy = 2 };

// Front door, server to caller at accept.
struct Hello {
  uint32_t magic;
  uint32_t reserved;  // 0
  Nonce nonce;        // random, one per connection
};
// Caller to server, then address_length bytes: the caller's worker address.
struct Proof {
  uint32_t magic;
  uint32_t address_length;      // 1..kMaxAddress
  Nonce nonce;                  // the caller's, random
  char identity[kMaxIdentity];  // the caller's, zero-padded, not empty
  Mac mac;                      // proof_mac()
};
// Server to caller, then address_length bytes: the server's worker address.
struct Welcome {
  uint32_t magic;
  uint32_t address_length;  // 1..kMaxAddress
  uint64_t session;         // random, not 0
  Mac mac;                  // welcome_mac()
};
struct RequestHeader {
  uint32_t magic;
  uint32_t reserved;  // 0
  uint64_t session;   // from the Welcome
  uint64_t call;      // the caller's; echoed in the answer
  uint64_t seq;       // 1, 2, ... in each session
  Mac mac;            // request_mac()
};
struct AnswerHeader {
  uint32_t magic;
  uint32_t answer;
  uint64_t session;  // the request's, echoed
  uint64_t call;
  Mac mac;  // answer_mac()
};

bool proof_mac(std::string_view key, const Nonce& server, const Nonce& caller,
               std::string_view destination, uint16_t port, std::string_view identity,
               std::string_view address, Mac& out);
bool welcome_mac(std::string_view key, const Nonce& server, const Nonce& caller,
                 std::string_view destination, uint16_t port, std::string_view identity,
                 uint64_t session, std::string_view address, Mac& out);
bool request_mac(std::string_view key, const Nonce& nonce, uint64_t seq, uint64_t call,
                 std::string_view destination, std::string_view request, Mac& out);
bool answer_mac(std::string_view key, const Nonce& nonce, uint64_t seq, uint64_t call,
                uint32_t answer, std::string_view payload, Mac& out);
bool same_mac(const Mac& a, const Mac& b);  // in constant time

// The job's ports within [low, high] in the order to try: all of them when
// the range has at most kPortCandidates ports, else kPortCandidates of them,
// distinct, in an order drawn from the key; empty when the range is empty.
std::vector<uint16_t> port_candidates(std::string_view key, uint16_t low, uint16_t high);

bool decode_hello(const void* bytes, size_t length, Hello& out);
// The fixed part of a Proof or Welcome (length: at least its size): whether
// it is one, and how many address bytes follow.
bool decode_proof_head(const void* bytes, size_t length, Proof& out);
bool decode_welcome_head(const void* bytes, size_t length, Welcome& out);
// The caller's identity in a decoded Proof: false when empty or not padded
// with zeros.
bool proof_identity(const Proof& proof, std::string_view& out);

// A request as it arrived: header bytes, payload length, whether UCX offers
// it by rendezvous. False and why when it is not one to verify.
bool decode_request(const void* header, size_t header_length, size_t length, bool rndv,
                    RequestHeader& out, std::string& why);
bool decode_answer(const void* header, size_t header_length, AnswerHeader& out);

// The sequence numbers a session has used: fresh() for one not used and
// not older than the 64 before the highest.
struct Window {
  uint64_t top = 0;   // the highest taken
  uint64_t seen = 0;  // bit i: top - i taken
  bool fresh(uint64_t seq) const;
  void take(uint64_t seq);
};
}  // namespace wire

}  // namespace monarch::peers
