#include "peers.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace monarch::peers {

const char* to_string(Code code) {
  switch (code) {
    case Code::ok:
      return "ok";
    case Code::timeout:
      return "timeout";
    case Code::unreachable:
      return "unreachable";
    case Code::refused:
      return "refused";
    case Code::error:
      return "error";
    case Code::busy:
      return "busy";
  }
  return "?";
}

namespace wire {
namespace {

// HMAC-SHA256(key, the parts one after another). False if OpenSSL fails: then
// nothing is signed nor verifies.
bool hmac(std::string_view key, std::initializer_list<std::string_view> parts, Mac& out) {
  static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);  // shared, never freed
  EVP_MAC_CTX* ctx = mac ? EVP_MAC_CTX_new(mac) : nullptr;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  static const unsigned char no_key = 0;  // an empty key, not "keep the last one"
  bool ok =
      ctx &&
      EVP_MAC_init(ctx, key.empty() ? &no_key : reinterpret_cast<const unsigned char*>(key.data()),
                   key.size(), params);
  for (std::string_view part : parts)
    ok =
        ok && EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(part.data()), part.size());
  size_t length = 0;
  ok = ok && EVP_MAC_final(ctx, out.data(), &length, out.size()) && length == out.size();
  EVP_MAC_CTX_free(ctx);
  return ok;
}

// Little-endian, so that MACs do not depend on the machine.
template <size_t N>
struct Le {
  char bytes[N];
  explicit Le(uint64_t v) {
    for (size_t i = 0; i < N; ++i) bytes[i] = static_cast<char>(v >> (8 * i));
  }
  operator std::string_view() const { return {bytes, N}; }
};

std::string_view view(const Nonce& nonce) {
  return {reinterpret_cast<const char*>(nonce.data()), nonce.size()};
}

}  // namespace

// Variable fields go in with their lengths: "node1" + "2..." and "node12" +
// "..." sign differently.
bool request_mac(std::string_view key, const Nonce& nonce, uint64_t seq, uint64_t call,
                 std::string_view destination, std::string_view request, Mac& out) {
  return hmac(key,
              {"monarch-request", view(nonce), Le<8>(seq), Le<8>(call), Le<4>(destination.size()),
               destination, request},
              out);
}

bool answer_mac(std::string_view key, const Nonce& nonce, uint64_t seq, uint64_t call,
                uint32_t answer, std::string_view payload, Mac& out) {
  return hmac(key,
              {"monarch-answer", view(nonce), Le<8>(seq), Le<8>(call), Le<4>(answer),
               Le<8>(payload.size()), payload},
              out);
}

bool proof_mac(std::string_view key, const Nonce& server, const Nonce& caller,
               std::string_view destination, uint16_t port, std::string_view identity,
               std::string_view address, Mac& out) {
  return hmac(
      key,
      {"monarch-door-caller", view(server), view(caller), Le<4>(destination.size()), destination,
       Le<2>(port), Le<4>(identity.size()), identity, Le<4>(address.size()), address},
      out);
}

bool welcome_mac(std::string_view key, const Nonce& server, const Nonce& caller,
                 std::string_view destination, uint16_t port, std::string_view identity,
                 uint64_t session, std::string_view address, Mac& out) {
  return hmac(key,
              {"monarch-door-server", view(server), view(caller), Le<4>(destination.size()),
               destination, Le<2>(port), Le<4>(identity.size()), identity, Le<8>(session),
               Le<4>(address.size()), address},
              out);
}

// The first `count` places of a Fisher-Yates shuffle of the range, place i
// drawn by HMAC(key, "monarch-port-v2" le32(i)).
std::vector<uint16_t> port_candidates(std::string_view key, uint16_t low, uint16_t high) {
  if (low == 0 || high < low) return {};
  uint32_t range = uint32_t(high) - low + 1;
  std::vector<uint16_t> ports(range);
  for (uint32_t i = 0; i < range; ++i) ports[i] = uint16_t(low + i);
  uint32_t count = std::min<uint32_t>(range, kPortCandidates);
  for (uint32_t i = 0; i < count; ++i) {
    Mac mac{};
    if (!hmac(key, {"monarch-port-v2", Le<4>(i)}, mac)) return {};
    uint64_t draw = 0;
    for (size_t b = 0; b < 8; ++b) draw |= uint64_t(mac[b]) << (8 * b);
    std::swap(ports[i], ports[i + draw % (range - i)]);
  }
  ports.resize(count);
  return ports;
}

bool same_mac(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool decode_hello(const void* bytes, size_t length, Hello& out) {
  out = {};
  if (length != sizeof out) return false;
  std::memcpy(&out, bytes, sizeof out);
  return out.magic == kMagic && out.reserved == 0;
}

bool decode_proof_head(const void* bytes, size_t length, Proof& out) {
  out = {};
  if (length < sizeof out) return false;
  std::memcpy(&out, bytes, sizeof out);
  return out.magic == kMagic && out.address_length >= 1 && out.address_length <= kMaxAddress;
}

bool decode_welcome_head(const void* bytes, size_t length, Welcome& out) {
  out = {};
  if (length < sizeof out) return false;
  std::memcpy(&out, bytes, sizeof out);
  return out.magic == kMagic && out.session != 0 && out.address_length >= 1 &&
         out.address_length <= kMaxAddress;
}

bool proof_identity(const Proof& proof, std::string_view& out) {
  size_t n = strnlen(proof.identity, kMaxIdentity);
  for (size_t i = n; i < kMaxIdentity; ++i)
    if (proof.identity[i] != 0) return false;
  out = {proof.identity, n};
  return n > 0;
}

bool decode_request(const void* header, size_t header_length, size_t length, bool rndv,
                    RequestHeader& out, std::string& why) {
  out = {};
  if (header_length != sizeof out) {
    why = "a request header of " + std::to_string(header_length) + " bytes";
    return false;
  }
  std::memcpy(&out, header, sizeof out);
  if (out.magic != kMagic || out.reserved != 0) {
    why = "not a request of this version";
    return false;
  }
  if (length > kMaxRequest || rndv) {
    why = "a request of " + std::to_string(length) + " bytes" + (rndv ? " by rendezvous" : "");
    return false;
  }
  if (out.seq == 0) {
    why = "a request without a sequence number";
    return false;
  }
  return true;
}

bool decode_answer(const void* header, size_t header_length, AnswerHeader& out) {
  out = {};
  if (header_length != sizeof out) return false;
  std::memcpy(&out, header, sizeof out);
  return out.magic == kMagic && out.answer <= kAnswerBusy;
}

bool Window::fresh(uint64_t seq) const {
  if (seq == 0) return false;
  if (seq > top) return true;
  uint64_t back = top - seq;
  return back < 64 && !((seen >> back) & 1);
}

void Window::take(uint64_t seq) {
  if (seq > top) {
    uint64_t shift = seq - top;
    seen = shift >= 64 ? 0 : seen << shift;
    top = seq;
  }
  seen |= uint64_t{1} << (top - seq);
}

}  // namespace wire

namespace {

using Clock = std::chrono::steady_clock;
using namespace wire;

std::string ucx_text(ucs_status_t status) {
  return ucs_status_string(status);
}

struct Address {
  sockaddr_storage addr{};
  socklen_t len = 0;
};

// IPv4 only, to listen and to call: Debian 12's UCX (1.13.1) writes past the
// end of a buffer when it connects over IPv6 on a TCP interface, and the
// default listener (0.0.0.0) takes IPv4 alone, so a node name whose first
// address is IPv6 would be called where nobody listens.
bool resolve(const std::string& host, uint16_t port, bool passive, Address& out,
             std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    error = "cannot resolve '" + host + "' to an IPv4 address (" + gai_strerror(rc) +
            "): the stagers of a job talk over IPv4 only";
    return false;
  }
  std::memcpy(&out.addr, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  return true;
}

// A numeric IPv4 address: never a name lookup.
bool numeric(const std::string& text, uint16_t port, Address& out) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (inet_pton(AF_INET, text.c_str(), &a.sin_addr) != 1) return false;
  std::memcpy(&out.addr, &a, sizeof a);
  out.len = sizeof a;
  return true;
}

void set_port(Address& a, uint16_t port) {
  reinterpret_cast<sockaddr_in*>(&a.addr)->sin_port = htons(port);
}

std::string text_of(uint32_t ipv4) {
  in_addr a{ipv4};
  char text[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

uint64_t random64() {
  uint64_t v = 0;
  while (v == 0)
    if (getrandom(&v, sizeof v, 0) != ssize_t(sizeof v)) v = 0;
  return v;
}

bool random_nonce(Nonce& nonce) {
  return getrandom(nonce.data(), nonce.size(), 0) == ssize_t(nonce.size());
}

// A session with a stager, as its handshake gave it.
struct Session {
  uint64_t id = 0;
  Nonce nonce{};        // the server's, which every MAC of the session covers
  std::string address;  // the server's worker address
  // When the session was made or last brought an answer to one of its calls
  // (Clock ticks): a call that times out when that is Limits::silent_session_ms
  // ago ends the session.
  std::shared_ptr<std::atomic<Clock::rep>> heard;
};

// One call, shared by the calling thread (which waits on it until the
// deadline, then verifies the answer) and the progress thread (which
// receives it). The first finish() wins; `reply`, `answer` and `mac` are
// written by the progress thread only before it finishes, and read by the
// caller only after a `received` finish.
struct Call {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  bool received = false;  // an answer is in reply
  bool verified = false;  // its MAC checked already (eager answers, on the progress thread)
  Status status;
  std::vector<char> reply;
  uint32_t answer = 0;
  Mac mac{};  // the answer's
  size_t max_reply = 0;
  std::string request;
  std::string host;  // the destination, which the request's MAC covers
  std::string peer;  // "host:port"
  Session session;
  Clock::time_point deadline;
  // The progress thread's only, until the answer is received.
  uint64_t id = 0;
  uint64_t conn = 0;
  uint64_t seq = 0;

  void finish(Code code, std::string text) {
    std::lock_guard lock(m);
    if (done) return;
    done = true;
    status = {code, std::move(text)};
    cv.notify_all();
  }
  void receive(uint32_t code, const Mac& answer_mac, bool checked) {
    std::lock_guard lock(m);
    if (done) return;
    done = received = true;
    verified = checked;
    answer = code;
    mac = answer_mac;
    cv.notify_all();
  }
};

// A UCX endpoint of ours with its session: to a server we called, or to a
// caller that completed a handshake with us.
struct Conn {
  ucp_ep_h ep = nullptr;
  bool server = false;  // the session is one our front door gave
  std::string peer;
  uint64_t session = 0;
  Nonce nonce{};  // the session's
  // Ours (we called): the next sequence number; the calls waiting on it.
  uint64_t next_seq = 1;
  std::unordered_set<uint64_t> calls;
  // Served: the caller's address, when, the sequence numbers it used, its
  // requests being served.
  uint32_t source = 0;
  Clock::time_point opened;
  Window window;
  unsigned in_flight = 0;
};

// A front door connection in its handshake: the Hello sent, the Proof
// arriving.
struct Door {
  int fd = -1;
  uint32_t source = 0;
  Clock::time_point opened;
  Nonce nonce{};
  std::string in;  // what came of the Proof, at most sizeof(Proof) + kMaxAddress
  size_t want = sizeof(Proof);
};

// epoll tags; front door connections are tagged with their id, from kFirstId.
constexpr uint64_t kWorkerTag = 0, kWakeTag = 1, kListenTag = 2, kFirstId = 16;
constexpr int kAcceptsPerTurn = 64;

}  // namespace

namespace detail {

// The answers handed to a Peers and not yet done with by UCX (Held), shared
// by every thread.
struct Tally {
  std::atomic<uint64_t> answers{0}, bytes{0}, peak_answers{0}, peak_bytes{0};
  std::atomic<uint64_t> busy{0}, too_large{0};
};

void raise_to(std::atomic<uint64_t>& peak, uint64_t value) {
  uint64_t was = peak.load();
  while (was < value && !peak.compare_exchange_weak(was, value)) {
  }
}

// One answer counted in a Tally from Reply::send until whatever holds it
// goes: UCX done with it (its SendContext deleted), or discarded before.
class Charge {
 public:
  // False, counting nothing, when `bytes` more would pass `bound`.
  bool take(Tally& tally, uint64_t bytes, uint64_t bound = UINT64_MAX) {
    uint64_t was = tally.bytes.load();
    do {
      if (was + bytes > bound) return false;
    } while (!tally.bytes.compare_exchange_weak(was, was + bytes));
    raise_to(tally.peak_bytes, was + bytes);
    raise_to(tally.peak_answers, ++tally.answers);
    tally_ = &tally;
    bytes_ = bytes;
    return true;
  }
  Charge() = default;
  Charge(const Charge&) = delete;
  Charge& operator=(const Charge&) = delete;
  ~Charge() {
    if (!tally_) return;
    tally_->bytes -= bytes_;
    --tally_->answers;
  }

 private:
  Tally* tally_ = nullptr;
  uint64_t bytes_ = 0;
};

struct Engine : std::enable_shared_from_this<Engine> {
  std::string key;
  std::string identity;
  Limits limits;
  std::unordered_set<uint32_t> allowed;  // IPv4, network order; empty: any
  Handler handler;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string worker_address;
  int listen_fd = -1;
  uint16_t port = 0;
  uint32_t source_ipv4 = INADDR_ANY;  // what we listen on, network order: our calls' source
  std::vector<uint16_t> candidates;   // port_candidates(), for calls to port 0
  int epoll_fd = -1;
  int wake_fd = -1;
  std::thread thread;

  // Shared with every thread. The tally outlives the queue, whose answers
  // count out when it goes.
  Tally tally;
  std::mutex queue_mutex;
  std::deque<std::function<void()>> queue;
  bool stopping = false;
  std::mutex resolved_mutex;
  std::map<std::string, Address> resolved;   // host
  std::map<std::string, std::string> hosts;  // Options::hosts, never changed
  // Sessions with the stagers we call ("host:port"), and one handshake at a
  // time per stager.
  std::mutex sessions_mutex;
  std::map<std::string, Session> sessions;
  std::map<std::string, std::shared_ptr<std::timed_mutex>> handshaking;
  // Per host called on the job's ports (calls to port 0): the candidate that
  // proved the key last, and where a search that found none goes on.
  struct Search {
    size_t proved = SIZE_MAX;
    size_t next = 0;
  };
  std::map<std::string, Search> searches;

  // The progress thread's only.
  uint64_t next_id = kFirstId;
  std::unordered_map<uint64_t, Conn> conns;
  std::unordered_map<ucp_ep_h, uint64_t> by_ep;
  std::unordered_map<uint64_t, uint64_t> by_session;  // served sessions -> conn
  std::unordered_map<std::string, uint64_t> called;   // "host:port" -> our conn to it
  std::unordered_map<uint64_t, std::shared_ptr<Call>> calls;
  std::unordered_map<uint64_t, Door> doors;
  std::vector<std::function<void()>> later;  // UCX work that UCX callbacks may not do
  std::vector<void*> closing;                // ucp_ep_close_nbx requests in flight
  // Answers handed to UCX and not done with: their connection, and when.
  std::unordered_map<uint64_t, std::pair<uint64_t, Clock::time_point>> answering;
  uint64_t next_answer = 1;
  Clock::time_point next_sweep;

  ~Engine() {
    for (auto& [id, door] : doors) close(door.fd);
    if (listen_fd >= 0) close(listen_fd);
    if (epoll_fd >= 0) close(epoll_fd);
    if (wake_fd >= 0) close(wake_fd);
  }

  // Runs f on the progress thread. False once stopping: f never runs.
  bool post(std::function<void()> f) {
    {
      std::lock_guard lock(queue_mutex);
      if (stopping) return false;
      queue.push_back(std::move(f));
    }
    uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof one);
    return true;
  }

  // init, run and shutdown run on the progress thread (Peers::start).
  bool init(const std::string& bind_address, uint16_t want_port, std::string& error);
  std::string init_error;  // init's, read by Peers::start once init returned
  bool listen_on(const Address& address, std::string& error);
  void run();
  void shutdown();

  // The front door, server side (progress thread).
  void accept_doors();
  void read_door(uint64_t id);
  void welcome(Door& door);
  void close_door(uint64_t id);
  // Client side (the calling thread).
  Status handshake(const Address& address, const std::string& host, const std::string& peer,
                   bool& admitted, Clock::time_point deadline, Session& out);
  Status session_for(const std::string& host, uint16_t port, Clock::time_point deadline,
                     Session& out);
  std::vector<size_t> search_order(const std::string& host);
  void searched(const std::string& host, const std::vector<size_t>& order, size_t tried,
                bool found);
  void forget_session(const std::string& peer, uint64_t session);
  void end_silent(const std::string& peer, uint64_t session);

  ucp_ep_h connect(const std::string& address, ucs_status_t& status);
  void start_call(const std::shared_ptr<Call>& call);
  void send_request(Conn& conn, uint64_t call_id);
  void send_answer(uint64_t session, const AnswerHeader& header, std::vector<char> bytes,
                   std::shared_ptr<void> hold, std::shared_ptr<Charge> charge);
  void sign_and_send(uint64_t session, uint64_t call, uint64_t seq, uint32_t answer,
                     std::string text);
  void drop(uint64_t conn, bool force = true);
  void fail_conn(uint64_t id, const std::string& why, Code code = Code::unreachable);
  void close_ep(ucp_ep_h ep, bool force);
  void sweep();

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_request(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_answer(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  void dispatch(uint64_t session, uint64_t call, uint64_t seq, std::vector<char> request);
};

}  // namespace detail

using detail::Charge;
using detail::Engine;

namespace {

// What a send keeps alive until UCX is done with its buffers.
struct SendContext {
  Engine* engine;
  std::string header;
  std::vector<char> payload;       // an answer's bytes
  std::shared_ptr<Call> call;      // a request's (its bytes, and whom to tell of a failure)
  std::shared_ptr<void> hold;      // Reply::send's
  std::shared_ptr<Charge> charge;  // an answer's
  uint64_t answer = 0;             // an answer's key in Engine::answering
  ~SendContext() {
    if (answer) engine->answering.erase(answer);
  }
};

// A request that cannot be sent fails its call and its connection (the next
// call makes a new session), whether or not UCX also reports the endpoint
// broken.
void request_failed(SendContext* ctx, ucs_status_t status);

void on_sent(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<SendContext*>(user_data);
  if (status != UCS_OK && ctx->call) request_failed(ctx, status);
  delete ctx;
  ucp_request_free(request);
}

// Posts an active message; ctx is owned by UCX until it completes.
void send_am(ucp_ep_h ep, unsigned id, const void* payload, size_t size, SendContext* ctx) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = on_sent;
  param.user_data = ctx;
  ucs_status_ptr_t request =
      ucp_am_send_nbx(ep, id, ctx->header.data(), ctx->header.size(), payload, size, &param);
  if (UCS_PTR_IS_PTR(request)) return;
  ucs_status_t status = UCS_PTR_STATUS(request);
  if (status != UCS_OK && ctx->call) request_failed(ctx, status);
  delete ctx;
}

// A rendezvous receive of an answer in flight, into call->reply.
struct ReceiveContext {
  std::shared_ptr<Call> call;
  uint32_t answer;
  Mac mac;
};

void on_received(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  auto* ctx = static_cast<ReceiveContext*>(user_data);
  if (status == UCS_OK)
    ctx->call->receive(ctx->answer, ctx->mac, false);
  else
    ctx->call->finish(Code::unreachable,
                      "receiving from " + ctx->call->peer + " failed: " + ucx_text(status));
  delete ctx;
  if (request != nullptr) ucp_request_free(request);
}

// Receives a rendezvous message into buffer; ctx is owned by UCX until done.
void receive_rndv(Engine* engine, void* desc, void* buffer, size_t length, ReceiveContext* ctx) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv_am = on_received;
  param.user_data = ctx;
  ucs_status_ptr_t request = ucp_am_recv_data_nbx(engine->worker, desc, buffer, length, &param);
  if (UCS_PTR_IS_PTR(request)) return;
  on_received(nullptr, UCS_PTR_STATUS(request), length, ctx);
}

void request_failed(SendContext* ctx, ucs_status_t status) {
  std::string why = "sending to " + ctx->call->peer + " failed: " + ucx_text(status);
  ctx->call->finish(Code::unreachable, why);
  Engine* engine = ctx->engine;
  engine->later.push_back([engine, conn = ctx->call->conn, why] { engine->fail_conn(conn, why); });
}

// Blocking I/O of the calling thread on a non-blocking socket, until the
// deadline. 1: done; 0: the peer closed first; -1: error or deadline (errno
// ETIMEDOUT).
int wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, int(std::min<long long>(left.count(), 1000)));
    if (rc > 0) return 1;
    if (rc < 0 && errno != EINTR) return -1;
  }
}

int read_exact(int fd, void* buffer, size_t length, Clock::time_point deadline) {
  char* p = static_cast<char*>(buffer);
  size_t got = 0;
  while (got < length) {
    ssize_t n = recv(fd, p + got, length - got, 0);
    if (n > 0) {
      got += size_t(n);
      continue;
    }
    if (n == 0) return 0;
    if (errno != EAGAIN && errno != EINTR) return -1;
    if (wait_fd(fd, POLLIN, deadline) < 0) return -1;
  }
  return 1;
}

int write_all(int fd, const void* buffer, size_t length, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(buffer);
  size_t sent = 0;
  while (sent < length) {
    ssize_t n = send(fd, p + sent, length - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += size_t(n);
      continue;
    }
    if (errno != EAGAIN && errno != EINTR) return -1;
    if (wait_fd(fd, POLLOUT, deadline) < 0) return -1;
  }
  return 1;
}

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

bool Engine::init(const std::string& bind_address, uint16_t want_port, std::string& error) {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) {
    error = "UCX configuration: " + ucx_text(status);
    return false;
  }
  // Peers are other nodes: shared memory is never their path, and fails
  // between the namespaces of nodes emulated on one machine.
  if (getenv("UCX_TLS") == nullptr) {
    status = ucp_config_modify(config, "TLS", "^sm");
    if (status != UCS_OK) {
      ucp_config_release(config);
      error = "UCX configuration TLS=^sm: " + ucx_text(status);
      return false;
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  status = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (status != UCS_OK) {
    error = "UCX init: " + ucx_text(status);
    return false;
  }
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // the progress thread only
  status = ucp_worker_create(context, &worker_params, &worker);
  if (status != UCS_OK) {
    error = "UCX worker: " + ucx_text(status);
    return false;
  }
  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  status = ucp_worker_get_address(worker, &address, &address_length);
  if (status != UCS_OK) {
    error = "UCX worker address: " + ucx_text(status);
    return false;
  }
  worker_address.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker, address);
  if (worker_address.empty() || worker_address.size() > kMaxAddress) {
    error = "UCX worker address of " + std::to_string(worker_address.size()) + " bytes (at most " +
            std::to_string(kMaxAddress) + "): too many network devices; set UCX_NET_DEVICES";
    return false;
  }
  for (auto [id, cb] :
       {std::pair{kRequestAm, &Engine::on_request}, {kAnswerAm, &Engine::on_answer}}) {
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    am.id = id;
    am.cb = cb;
    am.arg = this;
    am.flags = UCP_AM_FLAG_WHOLE_MSG;
    status = ucp_worker_set_am_recv_handler(worker, &am);
    if (status != UCS_OK) {
      error = "UCX active message handler: " + ucx_text(status);
      return false;
    }
  }

  int worker_fd = -1;
  status = ucp_worker_get_efd(worker, &worker_fd);
  if (status != UCS_OK) {
    error = "UCX worker event descriptor: " + ucx_text(status);
    return false;
  }
  wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd < 0 || epoll_fd < 0) {
    error = std::string("epoll: ") + strerror(errno);
    return false;
  }
  for (auto [fd, tag] : {std::pair{worker_fd, kWorkerTag}, {wake_fd, kWakeTag}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      error = std::string("epoll: ") + strerror(errno);
      return false;
    }
  }

  Address where;
  if (!numeric(bind_address, want_port, where) &&
      !resolve(bind_address, want_port, true, where, error))
    return false;
  source_ipv4 = reinterpret_cast<sockaddr_in*>(&where.addr)->sin_addr.s_addr;
  if (want_port != 0 || candidates.empty()) return listen_on(where, error);
  // The job's ports: the first free one. One taken (another job's, a
  // squatter's) costs a caller one try: callers try them in the same order.
  for (size_t i = 0; i < candidates.size(); ++i) {
    set_port(where, candidates[i]);
    if (listen_on(where, error)) {
      spdlog::info("peer transport: listening on port {}, the job's port candidate #{} of {}{}",
                   port, i + 1, candidates.size(),
                   i ? " (" + std::to_string(i) + " before it taken)" : std::string());
      return true;
    }
    if (errno != EADDRINUSE) return false;  // the address, not the port: no other will do
  }
  error = "all " + std::to_string(candidates.size()) +
          " of the job's port candidates are taken, by another job's stager or another program "
          "(the last: " +
          error + "): widen the peer port range";
  return false;
}

// The front door: a non-blocking TCP listener on the progress thread's
// epoll. SO_REUSEADDR: a stager restarted on its port gets it back while the
// connections of the one before linger in TIME_WAIT (Linux still refuses a
// second listener on a port in use).
bool Engine::listen_on(const Address& address, std::string& error) {
  auto where = [&] {
    auto* a = reinterpret_cast<const sockaddr_in*>(&address.addr);
    return text_of(a->sin_addr.s_addr) + ":" + std::to_string(ntohs(a->sin_port));
  };
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, reinterpret_cast<const sockaddr*>(&address.addr), address.len) != 0 ||
      listen(fd, 128) != 0) {
    int err = errno;
    error = "listening on " + where() + ": " + strerror(err);
    if (fd >= 0) close(fd);
    errno = err;  // the caller tells a port taken from the rest
    return false;
  }
  sockaddr_in bound{};
  socklen_t length = sizeof bound;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0 ||
      epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    error = "listening on " + where() + ": " + strerror(errno);
    close(fd);
    return false;
  }
  listen_fd = fd;
  port = ntohs(bound.sin_port);
  return true;
}

// The progress loop: our queue, then UCX until idle, then the front door and
// sleep on every descriptor. Wakes every 20 ms while calls wait or handshakes
// are under way (to forget calls past their deadline, whose callers never
// wait on this thread, and to drop handshakes past theirs), else every 200 ms.
void Engine::run() {
  for (;;) {
    std::deque<std::function<void()>> work;
    bool stop;
    {
      std::lock_guard lock(queue_mutex);
      work.swap(queue);
      stop = stopping;
    }
    for (auto& f : work) f();
    while (ucp_worker_progress(worker) != 0) {
    }
    while (!later.empty()) {
      auto todo = std::move(later);
      later.clear();
      for (auto& f : todo) f();
      while (ucp_worker_progress(worker) != 0) {
      }
    }
    if (stop) return;
    sweep();
    // UCX busy or work queued: look at the descriptors without sleeping.
    bool sleep = work.empty() && ucp_worker_arm(worker) == UCS_OK;
    bool busy = !calls.empty() || !closing.empty() || !doors.empty();
    epoll_event events[32];
    int n = epoll_wait(epoll_fd, events, 32, !sleep ? 0 : busy ? 20 : 200);
    for (int i = 0; i < n; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kListenTag)
        accept_doors();
      else if (tag >= kFirstId)
        read_door(tag);
    }
    uint64_t count;
    (void)!read(wake_fd, &count, sizeof count);
  }
}

// At most kAcceptsPerTurn a turn, so that UCX and the calls keep their share
// of the thread whatever arrives. Only the job's addresses are kept. A new
// connection takes the place of the oldest one in its handshake from its
// address when that address is at its bound; when all are at theirs, of the
// oldest one of the address holding the most (the new one counted), so that
// a flood from a few addresses evicts its own handshakes, never a lone
// caller's: when every address holds one, the new connection is closed.
void Engine::accept_doors() {
  for (int i = 0; i < kAcceptsPerTurn; ++i) {
    sockaddr_in from{};
    socklen_t length = sizeof from;
    int fd = accept4(listen_fd, reinterpret_cast<sockaddr*>(&from), &length,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN, or out of descriptors: those wait in the backlog
    uint32_t source = from.sin_addr.s_addr;
    if (from.sin_family != AF_INET || (!allowed.empty() && !allowed.count(source))) {
      close(fd);
      continue;
    }
    // Per address: how many handshakes, and its oldest.
    auto tally = [&] {
      std::unordered_map<uint32_t, std::pair<unsigned, uint64_t>> held;
      for (auto& [other, door] : doors) {
        auto& [count, old] = held[door.source];
        if (!count++ || door.opened < doors[old].opened) old = other;
      }
      return held;
    };
    auto held = tally();
    if (held[source].first >= limits.unauthenticated_per_source) {
      close_door(held[source].second);
      held = tally();
    }
    if (doors.size() >= limits.unauthenticated) {
      uint32_t most = source;
      unsigned count = held[source].first + 1;
      for (auto& [from, h] : held)
        if (h.first > count) most = from, count = h.first;
      if (count <= 1) {
        close(fd);  // every address holds one: none is evicted for this one
        continue;
      }
      close_door(held[most].second);  // `source` counted the new one: it holds one at least
    }

    Door door;
    door.fd = fd;
    door.source = source;
    door.opened = Clock::now();
    Hello hello{kMagic, 0, {}};
    // A fresh socket's buffer takes 24 bytes at once, or the caller is not
    // one to wait for.
    if (!random_nonce(door.nonce) ||
        (hello.nonce = door.nonce,
         send(fd, &hello, sizeof hello, MSG_NOSIGNAL | MSG_DONTWAIT) != ssize_t(sizeof hello))) {
      close(fd);
      continue;
    }
    uint64_t id = next_id++;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = id;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      close(fd);
      continue;
    }
    doors.emplace(id, std::move(door));
  }
}

void Engine::close_door(uint64_t id) {
  auto it = doors.find(id);
  if (it == doors.end()) return;
  close(it->second.fd);  // also takes it out of the epoll set
  doors.erase(it);
}

// The Proof, as it comes: its fixed part says how long the address is.
void Engine::read_door(uint64_t id) {
  auto it = doors.find(id);
  if (it == doors.end()) return;
  Door& door = it->second;
  char buffer[sizeof(Proof) + kMaxAddress];
  ssize_t n = recv(door.fd, buffer, door.want - door.in.size(), 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return close_door(id);
  if (n < 0) return;
  door.in.append(buffer, size_t(n));
  if (door.in.size() == sizeof(Proof) && door.want == sizeof(Proof)) {
    Proof head;
    if (!decode_proof_head(door.in.data(), door.in.size(), head)) return close_door(id);
    door.want = sizeof(Proof) + head.address_length;
    return;  // the address follows
  }
  if (door.in.size() < door.want) return;
  welcome(door);
  close_door(id);
}

// A complete Proof: if it proves the key for this stager, a session, our
// endpoint to the caller's worker, and the Welcome. Else the connection just
// closes.
void Engine::welcome(Door& door) {
  Proof proof;
  std::string_view caller;
  if (!decode_proof_head(door.in.data(), door.in.size(), proof) || !proof_identity(proof, caller))
    return;
  std::string_view address(door.in.data() + sizeof proof, proof.address_length);
  Mac expected;
  if (!proof_mac(key, door.nonce, proof.nonce, identity, port, caller, address, expected) ||
      !same_mac(expected, proof.mac))
    return;
  // With the job's nodes known, a caller is the node it says it is: its
  // connection comes from that node's address.
  if (!hosts.empty()) {
    auto it = hosts.find(std::string(caller));
    Address claimed;
    if (it == hosts.end() || !numeric(it->second, 0, claimed) ||
        reinterpret_cast<sockaddr_in*>(&claimed.addr)->sin_addr.s_addr != door.source)
      return;
  }
  uint64_t session = random64();
  while (by_session.count(session)) session = random64();
  ucs_status_t status;
  ucp_ep_h ep = connect(std::string(address), status);
  if (!ep) return;
  uint64_t conn_id = next_id++;
  Conn& conn = conns[conn_id];
  conn.ep = ep;
  conn.server = true;
  conn.peer = "the caller " + std::string(caller) + " at " + text_of(door.source);
  conn.session = session;
  conn.nonce = door.nonce;
  conn.source = door.source;
  conn.opened = Clock::now();
  by_ep[ep] = conn_id;
  by_session[session] = conn_id;

  Welcome w{kMagic, uint32_t(worker_address.size()), session, {}};
  std::string out;
  if (welcome_mac(key, door.nonce, proof.nonce, identity, port, caller, session, worker_address,
                  w.mac)) {
    out.assign(reinterpret_cast<const char*>(&w), sizeof w);
    out += worker_address;
  }
  // A caller with the key reads its Welcome at once: one that leaves it in
  // the socket's buffer (at most kMaxAddress and a header) gets no session.
  if (out.empty() ||
      send(door.fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT) != ssize_t(out.size()))
    return drop(conn_id);

  // A restarted caller's new session replaces its oldest.
  uint64_t oldest = 0;
  unsigned count = 0;
  Clock::time_point when = Clock::time_point::max();
  for (auto& [other, c] : conns) {
    if (!c.server || c.source != door.source) continue;
    ++count;
    if (other != conn_id && c.opened < when) when = c.opened, oldest = other;
  }
  if (count > limits.authenticated_per_source && oldest) drop(oldest, false);
}

ucp_ep_h Engine::connect(const std::string& address, ucs_status_t& status) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_ep_error;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  status = ucp_ep_create(worker, &params, &ep);
  return status == UCS_OK ? ep : nullptr;
}

// The caller's side of the front door, on the calling thread. From the
// address this stager listens on, when it is one: the server checks that a
// caller's connection comes from the caller's node's address (Options::hosts).
// A connection that ends before the Welcome is `unreachable`: the server
// closes it for a Proof it does not take, but also when a flood evicts it,
// and the caller cannot tell which; only a Hello or a Welcome that is not
// Monarch's or not signed with the key is `refused`.
Status Engine::handshake(const Address& address, const std::string& host, const std::string& peer,
                         bool& admitted, Clock::time_point deadline, Session& out) {
  Fd s{socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)};
  if (s.fd < 0) return {Code::error, std::string("socket: ") + strerror(errno)};
  if (source_ipv4 != INADDR_ANY) {
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_addr.s_addr = source_ipv4;
    if (bind(s.fd, reinterpret_cast<const sockaddr*>(&from), sizeof from) != 0)
      return {Code::unreachable,
              "calling " + peer + " from " + text_of(source_ipv4) + ": " + strerror(errno)};
  }
  uint16_t dialed = ntohs(reinterpret_cast<const sockaddr_in*>(&address.addr)->sin_port);
  if (::connect(s.fd, reinterpret_cast<const sockaddr*>(&address.addr), address.len) != 0) {
    int err = errno;
    if (err == EINPROGRESS && wait_fd(s.fd, POLLOUT, deadline) > 0) {
      socklen_t length = sizeof err;
      getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &err, &length);
    } else if (err == EINPROGRESS) {
      err = errno;
    }
    if (err == ETIMEDOUT) return {Code::timeout, "no answer from " + peer + " in time"};
    if (err != 0 && err != EISCONN)
      return {Code::unreachable, "connecting to " + peer + ": " + strerror(err)};
  }
  admitted = true;
  auto io_failed = [&](int rc, const char* what) -> Status {
    if (rc == 0)
      return {Code::unreachable,
              peer + " closed the connection " + what +
                  " (not a stager of this job, not the one asked for, this node not one of the "
                  "job's, or its front door overloaded)"};
    if (errno == ETIMEDOUT) return {Code::timeout, "no answer from " + peer + " in time"};
    return {Code::unreachable, "the connection to " + peer + " broke: " + strerror(errno)};
  };
  Hello hello;
  char buffer[sizeof(Welcome) + kMaxAddress];
  int rc = read_exact(s.fd, buffer, sizeof hello, deadline);
  if (rc <= 0) return io_failed(rc, "at once");
  if (!decode_hello(buffer, sizeof hello, hello))
    return {Code::refused, peer + " is not a Monarch stager's front door"};

  Proof proof{kMagic, uint32_t(worker_address.size()), {}, {}, {}};
  if (!random_nonce(proof.nonce)) return {Code::error, "no random bytes"};
  std::memcpy(proof.identity, this->identity.data(), this->identity.size());
  if (!proof_mac(key, hello.nonce, proof.nonce, host, dialed, this->identity, worker_address,
                 proof.mac))
    return {Code::error, "HMAC-SHA256 (OpenSSL) failed"};
  std::string message(reinterpret_cast<const char*>(&proof), sizeof proof);
  message += worker_address;
  rc = write_all(s.fd, message.data(), message.size(), deadline);
  if (rc <= 0) return io_failed(rc, "before its welcome");

  Welcome w;
  rc = read_exact(s.fd, buffer, sizeof w, deadline);
  if (rc <= 0) return io_failed(rc, "before its welcome");
  if (!decode_welcome_head(buffer, sizeof w, w))
    return {Code::refused, peer + ": not a Monarch stager's welcome"};
  rc = read_exact(s.fd, buffer + sizeof w, w.address_length, deadline);
  if (rc <= 0) return io_failed(rc, "in its welcome");
  std::string_view theirs(buffer + sizeof w, w.address_length);
  Mac expected;
  if (!welcome_mac(key, hello.nonce, proof.nonce, host, dialed, this->identity, w.session, theirs,
                   expected) ||
      !same_mac(expected, w.mac))
    return {Code::refused, peer + ": welcome not signed with this job's key"};
  out = {w.session, hello.nonce, std::string(theirs),
         std::make_shared<std::atomic<Clock::rep>>(Clock::now().time_since_epoch().count())};
  return {};
}

// The session with host:port: the one we have, else a handshake (one at a
// time per peer; the others wait for it, within their deadline).
Status Engine::session_for(const std::string& host, uint16_t port, Clock::time_point deadline,
                           Session& out) {
  std::string peer = host + ":" + std::to_string(port);
  std::shared_ptr<std::timed_mutex> lock;
  {
    std::lock_guard guard(sessions_mutex);
    if (auto it = sessions.find(peer); it != sessions.end()) {
      out = it->second;
      return {};
    }
    auto& l = handshaking[peer];
    if (!l) l = std::make_shared<std::timed_mutex>();
    lock = l;
  }
  std::unique_lock held(*lock, std::defer_lock);
  if (!held.try_lock_until(deadline)) return {Code::timeout, "no answer from " + peer + " in time"};
  {
    std::lock_guard guard(sessions_mutex);
    if (auto it = sessions.find(peer); it != sessions.end()) {
      out = it->second;
      return {};
    }
  }
  Address address;
  {
    std::lock_guard guard(resolved_mutex);
    if (auto it = resolved.find(host); it != resolved.end()) address = it->second;
  }
  // With the job's nodes given, a name is never resolved: a lookup could
  // hang, and a name not among them is not the job's.
  if (address.len == 0) {
    std::string error;
    auto known = hosts.find(host);
    if (!hosts.empty() && known == hosts.end())
      return {Code::unreachable,
              host + " is not one of the job's nodes with an address (never looked up)"};
    if (known != hosts.end() ? !numeric(known->second, 0, address)
                             : !resolve(host, 0, false, address, error))
      return {Code::unreachable, error.empty() ? "no address for " + host : error};
    std::lock_guard guard(resolved_mutex);
    resolved[host] = address;
  }
  set_port(address, port);
  // A connection the front door took and closed before its Welcome may have
  // been evicted by a flood from this node's address (another user's): tried
  // again, twice at most, within the deadline.
  Status status;
  for (int tries = 0; tries < 3; ++tries) {
    bool admitted = false;
    status = handshake(address, host, peer, admitted, deadline, out);
    if (status.code != Code::unreachable || !admitted || Clock::now() >= deadline) break;
  }
  if (!status.ok()) return status;
  std::lock_guard guard(sessions_mutex);
  sessions[peer] = out;
  return {};
}

// The candidates a call to `host` on the job's ports tries, in order: the
// one that proved the key last, then from where the last search left off,
// kTriesPerCall at most.
std::vector<size_t> Engine::search_order(const std::string& host) {
  std::lock_guard guard(sessions_mutex);
  const Search& s = searches[host];
  size_t n = candidates.size(), want = std::min<size_t>(n, kTriesPerCall);
  std::vector<size_t> order;
  if (s.proved < n) order.push_back(s.proved);
  for (size_t k = 0; order.size() < want; ++k)
    if ((s.next + k) % n != s.proved) order.push_back((s.next + k) % n);
  return order;
}

// The first `tried` of `order` were tried; the last of them proved the key
// when `found`. A search found nothing goes on after them next time; one
// that found starts from the first candidate once that one fails (a stager
// restarted takes the first free).
void Engine::searched(const std::string& host, const std::vector<size_t>& order, size_t tried,
                      bool found) {
  std::lock_guard guard(sessions_mutex);
  Search& s = searches[host];
  if (found) {
    s = {order[tried - 1], 0};
    return;
  }
  size_t passed = 0;
  for (size_t i = 0; i < tried; ++i) passed += order[i] != s.proved;
  s.next = (s.next + passed) % candidates.size();
}

void Engine::forget_session(const std::string& peer, uint64_t session) {
  std::lock_guard guard(sessions_mutex);
  auto it = sessions.find(peer);
  if (it != sessions.end() && it->second.id == session) sessions.erase(it);
}

// A session that let a call time out with nothing heard on it for
// Limits::silent_session_ms: the server may have forgotten it (it never says so: it ended the
// session, or never had it), so the next call makes another. Its endpoint
// goes, and the calls still waiting on it time out.
void Engine::end_silent(const std::string& peer, uint64_t session) {
  forget_session(peer, session);
  post([this, peer, session] {
    auto it = called.find(peer);
    if (it != called.end() && conns[it->second].session == session)
      fail_conn(it->second, "no answer from " + peer + " in time", Code::timeout);
  });
}

// After run() returned: every call fails, every connection closes (forced:
// answers not sent are dropped), then UCX goes.
void Engine::shutdown() {
  for (auto& [id, call] : calls) call->finish(Code::error, "peer transport stopped");
  calls.clear();
  for (auto& [id, conn] : conns) close_ep(conn.ep, true);
  conns.clear();
  auto give_up = Clock::now() + std::chrono::seconds(1);
  while (worker && Clock::now() < give_up) {
    ucp_worker_progress(worker);
    for (size_t i = 0; i < closing.size();) {
      if (ucp_request_check_status(closing[i]) == UCS_INPROGRESS) {
        ++i;
        continue;
      }
      ucp_request_free(closing[i]);
      closing.erase(closing.begin() + i);
    }
    if (closing.empty()) break;
  }
  if (worker) ucp_worker_destroy(worker);
  if (context) ucp_cleanup(context);
}

void Engine::close_ep(ucp_ep_h ep, bool force) {
  by_ep.erase(ep);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) closing.push_back(request);
}

// Calls past their deadline fail; those their caller gave up on are
// forgotten (an answer arriving later is dropped). Handshakes not done in
// time are dropped. Closes that completed are freed.
void Engine::sweep() {
  auto now = Clock::now();
  if (now < next_sweep) return;
  next_sweep = now + std::chrono::milliseconds(10);
  for (auto it = calls.begin(); it != calls.end();) {
    Call& call = *it->second;
    bool forget;
    {
      std::lock_guard lock(call.m);
      forget = call.done || now >= call.deadline;
    }
    if (!forget) {
      ++it;
      continue;
    }
    call.finish(Code::timeout, "no answer from " + call.peer + " in time");
    if (auto conn = conns.find(call.conn); conn != conns.end()) conn->second.calls.erase(it->first);
    it = calls.erase(it);
  }
  // A caller that has not taken an answer for answer_ms stopped taking them
  // (its stager stopped, its network went): its session ends, which lets go
  // of its answers; it handshakes again if it comes back.
  std::unordered_set<uint64_t> stalled;
  for (auto& [id, out] : answering)
    if (now - out.second > std::chrono::milliseconds(limits.answer_ms)) stalled.insert(out.first);
  for (uint64_t id : stalled) {
    auto conn = conns.find(id);
    if (conn == conns.end()) continue;  // dropped already; UCX lets go of its answers
    spdlog::warn("peer transport: {} took no answer for {} ms: its session ends", conn->second.peer,
                 limits.answer_ms);
    fail_conn(id, "answers not taken", Code::timeout);
  }
  std::vector<uint64_t> late;
  for (auto& [id, door] : doors)
    if (now - door.opened > std::chrono::milliseconds(limits.auth_ms)) late.push_back(id);
  for (uint64_t id : late) close_door(id);
  for (size_t i = 0; i < closing.size();) {
    if (ucp_request_check_status(closing[i]) == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    ucp_request_free(closing[i]);
    closing[i] = closing.back();
    closing.pop_back();
  }
}

// A connection closed: forced, answers not sent yet are dropped; else they
// go first.
void Engine::drop(uint64_t id, bool force) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  if (it->second.server) by_session.erase(it->second.session);
  close_ep(it->second.ep, force);
  conns.erase(it);
}

void Engine::fail_conn(uint64_t id, const std::string& why, Code code) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  Conn& conn = it->second;
  for (uint64_t call_id : conn.calls) {
    auto call = calls.find(call_id);
    if (call == calls.end()) continue;
    call->second->finish(code, why);
    calls.erase(call);
  }
  if (!conn.server) {
    called.erase(conn.peer);
    forget_session(conn.peer, conn.session);
  }
  drop(id);
}

void Engine::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<Engine*>(arg);
  auto it = self->by_ep.find(ep);
  if (it == self->by_ep.end()) return;
  uint64_t id = it->second;
  self->later.push_back([self, id, status] {
    auto conn = self->conns.find(id);
    if (conn == self->conns.end()) return;
    self->fail_conn(id, "connection to " + conn->second.peer + " lost: " + ucx_text(status));
  });
}

void Engine::start_call(const std::shared_ptr<Call>& call) {
  {
    std::lock_guard lock(call->m);
    if (call->done) return;  // its caller gave up while it waited in the queue
  }
  uint64_t conn_id = 0;
  if (auto it = called.find(call->peer); it != called.end()) {
    conn_id = it->second;
    // A session made after this one broke: this one goes.
    if (conns[conn_id].session != call->session.id) {
      fail_conn(conn_id, "session with " + call->peer + " replaced");
      conn_id = 0;
    }
  }
  if (!conn_id) {
    ucs_status_t status;
    ucp_ep_h ep = connect(call->session.address, status);
    if (!ep) {
      forget_session(call->peer, call->session.id);
      call->finish(Code::unreachable, "connecting to " + call->peer + ": " + ucx_text(status));
      return;
    }
    conn_id = next_id++;
    Conn& conn = conns[conn_id];
    conn.ep = ep;
    conn.peer = call->peer;
    conn.session = call->session.id;
    conn.nonce = call->session.nonce;
    by_ep[ep] = conn_id;
    called[call->peer] = conn_id;
  }
  uint64_t call_id = random64();
  while (calls.count(call_id)) call_id = random64();
  call->id = call_id;
  call->conn = conn_id;
  calls[call_id] = call;
  Conn& conn = conns[conn_id];
  conn.calls.insert(call_id);
  send_request(conn, call_id);
}

// Signed here, with the session's nonce and its next sequence number.
void Engine::send_request(Conn& conn, uint64_t call_id) {
  auto it = calls.find(call_id);
  if (it == calls.end()) return;  // given up meanwhile
  std::shared_ptr<Call> call = it->second;
  call->seq = conn.next_seq++;
  RequestHeader header{kMagic, 0, conn.session, call_id, call->seq, {}};
  if (!request_mac(key, conn.nonce, call->seq, call_id, call->host, call->request, header.mac))
    return call->finish(Code::error, "HMAC-SHA256 (OpenSSL) failed");
  auto* ctx = new SendContext{this, {}, {}, call, {}};
  ctx->header.assign(reinterpret_cast<const char*>(&header), sizeof header);
  send_am(conn.ep, kRequestAm, call->request.data(), call->request.size(), ctx);
}

// On our own endpoint of the session, never on a reply endpoint.
void Engine::send_answer(uint64_t session, const AnswerHeader& header, std::vector<char> bytes,
                         std::shared_ptr<void> hold, std::shared_ptr<Charge> charge) {
  auto by = by_session.find(session);
  if (by == by_session.end()) return;  // the caller is gone: nobody to tell
  Conn& conn = conns[by->second];
  if (conn.in_flight > 0) --conn.in_flight;
  auto* ctx =
      new SendContext{this, {}, std::move(bytes), nullptr, std::move(hold), std::move(charge)};
  ctx->answer = next_answer++;
  answering[ctx->answer] = {by->second, Clock::now()};
  ctx->header.assign(reinterpret_cast<const char*>(&header), sizeof header);
  send_am(conn.ep, kAnswerAm, ctx->payload.data(), ctx->payload.size(), ctx);
}

// An answer made on the progress thread: short texts only.
void Engine::sign_and_send(uint64_t session, uint64_t call_id, uint64_t seq, uint32_t answer,
                           std::string text) {
  auto by = by_session.find(session);
  if (by == by_session.end()) return;
  Conn& conn = conns[by->second];
  AnswerHeader header{kMagic, answer, session, call_id, {}};
  // All zeros if OpenSSL failed: the caller takes it for a stranger's.
  answer_mac(key, conn.nonce, seq, call_id, answer, text, header.mac);
  ++conn.in_flight;  // send_answer counts it out
  auto charge = std::make_shared<Charge>();
  charge->take(tally, 0);  // an error text: counted, never refused
  send_answer(session, header, {text.begin(), text.end()}, {}, std::move(charge));
}

// A request is served only if it decodes, names a live session, is fresh in
// it, and its MAC verifies for this stager's key, identity and the session's
// nonce. Any other is dropped unread and unanswered, and the session stays:
// whoever sent it proved nothing (a session id travels in clear), so no
// verdict about it is signed and it cannot end the session of the caller
// that holds the key. Nothing of a request by rendezvous is received; the
// endpoint it came on is not looked at.
ucs_status_t Engine::on_request(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Engine*>(arg);
  RequestHeader h;
  std::string why;
  bool decoded = decode_request(header, header_length, length,
                                param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV, h, why);
  auto by = self->by_session.find(h.session);
  if (h.session == 0 || by == self->by_session.end()) return UCS_OK;  // nobody to answer
  Conn& conn = self->conns[by->second];
  std::string_view request(static_cast<const char*>(data), length);
  Mac expected;
  if (!decoded || !conn.window.fresh(h.seq) ||
      !request_mac(self->key, conn.nonce, h.seq, h.call, self->identity, request, expected) ||
      !same_mac(expected, h.mac))
    return UCS_OK;
  conn.window.take(h.seq);
  if (conn.in_flight >= self->limits.in_flight) {
    self->later.push_back([self, session = h.session, call = h.call, seq = h.seq] {
      self->sign_and_send(session, call, seq, kAnswerBusy, "busy: too many requests at once");
    });
    return UCS_OK;
  }
  ++conn.in_flight;
  self->dispatch(h.session, h.call, h.seq, std::vector<char>(request.begin(), request.end()));
  return UCS_OK;
}

// Taken only for a call waiting on the session it names (call ids are
// random: nobody without the session's traffic names one).
ucs_status_t Engine::on_answer(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Engine*>(arg);
  AnswerHeader h;
  if (!decode_answer(header, header_length, h)) return UCS_OK;
  auto it = self->calls.find(h.call);
  if (it == self->calls.end()) return UCS_OK;  // late: given up
  auto conn = self->conns.find(it->second->conn);
  if (conn == self->conns.end() || conn->second.session != h.session || it->second->seq == 0)
    return UCS_OK;
  std::shared_ptr<Call> call = it->second;
  // An eager answer is checked here, before it touches the call: one that
  // does not verify (a stranger who read the call's ids off the network) is
  // dropped, and the call waits on for the genuine one.
  bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  const char* bytes = static_cast<const char*>(data);
  if (!rndv && length <= call->max_reply) {
    Mac expected;
    if (!answer_mac(self->key, call->session.nonce, call->seq, call->id, h.answer, {bytes, length},
                    expected) ||
        !same_mac(expected, h.mac))
      return UCS_OK;
    call->session.heard->store(Clock::now().time_since_epoch().count());
  }
  self->calls.erase(it);
  conn->second.calls.erase(h.call);
  if (length > call->max_reply) {
    call->finish(Code::error, call->peer + ": answer of " + std::to_string(length) +
                                  " bytes, more than the " + std::to_string(call->max_reply) +
                                  " asked for");
    return UCS_OK;
  }
  // By rendezvous: received whole, then verified by the caller before it
  // takes a byte (the MAC of up to a piece is the caller's thread's work).
  if (rndv) {
    call->reply.resize(length);
    receive_rndv(self, data, call->reply.data(), length, new ReceiveContext{call, h.answer, h.mac});
    return UCS_INPROGRESS;
  }
  call->reply.assign(bytes, bytes + length);
  call->receive(h.answer, h.mac, true);
  return UCS_OK;
}

void Engine::dispatch(uint64_t session, uint64_t call, uint64_t seq, std::vector<char> request) {
  Reply reply;
  reply.engine_ = weak_from_this();
  reply.session_ = session;
  reply.call_ = call;
  reply.seq_ = seq;
  reply.nonce_ = conns[by_session[session]].nonce;
  reply.armed_ = true;
  try {
    handler(std::move(request), std::move(reply));
  } catch (...) {
    // The Reply, if the handler had not answered, answered with an error
    // when it was destroyed.
  }
}

Reply::Reply(Reply&& other) noexcept {
  *this = std::move(other);
}

Reply& Reply::operator=(Reply&& other) noexcept {
  if (this != &other) {
    if (armed_) fail("dropped without a reply");
    engine_ = std::move(other.engine_);
    session_ = other.session_;
    call_ = other.call_;
    seq_ = other.seq_;
    nonce_ = other.nonce_;
    armed_ = other.armed_;
    other.armed_ = false;
  }
  return *this;
}

Reply::~Reply() {
  if (armed_) fail("dropped without a reply");
}

void Reply::send(std::vector<char> bytes, std::shared_ptr<void> hold) {
  answer(kAnswerOk, std::move(bytes), std::move(hold));
}

void Reply::fail(std::string text) {
  answer(kAnswerError, std::vector<char>(text.begin(), text.end()), {});
}

// Counted (Held) and signed on this thread: the progress thread only sends.
// An answer over the bounds goes as an error text instead, its bytes freed
// here (see Bounds in peers.h).
void Reply::answer(uint32_t code, std::vector<char> bytes, std::shared_ptr<void> hold) {
  if (!armed_) return;
  std::shared_ptr<Engine> engine = engine_.lock();
  if (!engine) return void(armed_ = false);
  detail::Tally& tally = engine->tally;
  const Limits& limits = engine->limits;
  auto charge = std::make_shared<Charge>();
  if (code == kAnswerOk && bytes.size() > limits.max_answer) {
    std::string text = "an answer of " + std::to_string(bytes.size()) + " bytes, more than the " +
                       std::to_string(limits.max_answer) + " one may be";
    uint64_t n = ++tally.too_large;
    if ((n & (n - 1)) == 0)  // the 1st, 2nd, 4th...: a handler's bug, not a flood of lines
      spdlog::error("peer transport: {} refused (a bug of the handler's; {} so far)", text, n);
    bytes = {};
    return answer(kAnswerError, {text.begin(), text.end()}, {});
  }
  if (code == kAnswerOk && !charge->take(tally, bytes.size(), limits.answer_bytes)) {
    ++tally.busy;
    std::string text = "busy: " + std::to_string(tally.bytes.load()) +
                       " bytes of answers being sent (at most " +
                       std::to_string(limits.answer_bytes) + "), ask again later";
    bytes = {};
    return answer(kAnswerBusy, {text.begin(), text.end()}, {});
  }
  if (code != kAnswerOk) charge->take(tally, 0);  // an error text: counted, never refused
  armed_ = false;
  AnswerHeader header{kMagic, code, session_, call_, {}};
  // All zeros if OpenSSL failed: the caller takes it for a stranger's.
  answer_mac(engine->key, nonce_, seq_, call_, code, {bytes.data(), bytes.size()}, header.mac);
  Engine* raw = engine.get();  // the queue runs only while the engine lives
  raw->post([raw, session = session_, header, bytes = std::move(bytes), hold = std::move(hold),
             charge = std::move(charge)]() mutable {
    raw->send_answer(session, header, std::move(bytes), std::move(hold), std::move(charge));
  });
}

Peers::Peers(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}

namespace {

// UCX keeps each connection to its transport listener open a while, a
// stranger's garbage included; when its accept() fails at the descriptor
// limit, UCX 1.13 drops the listener for good (or crashes) and no new caller
// is served. A job's soft limit is often 1024 (Slurm passes the submitting
// shell's on): the process takes what its hard limit allows.
void raise_descriptor_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

std::unique_ptr<Peers> Peers::start(Options options, Handler handler, std::string& error) {
  if (options.identity.empty() || options.identity.size() > kMaxIdentity ||
      options.identity.find('\0') != std::string::npos) {
    error = "a stager's name of 1 to " + std::to_string(kMaxIdentity) + " bytes, not '" +
            options.identity + "'";
    return nullptr;
  }
  if (options.port == 0 && options.port_high != 0 &&
      (options.port_low == 0 || options.port_high < options.port_low)) {
    error = "an empty port range " + std::to_string(options.port_low) + "-" +
            std::to_string(options.port_high);
    return nullptr;
  }
  if (options.limits.max_answer > options.limits.answer_bytes) {
    error = "an answer may be " + std::to_string(options.limits.max_answer) +
            " bytes, more than the " + std::to_string(options.limits.answer_bytes) +
            " bytes of answers held at once: it could never be sent";
    return nullptr;
  }
  raise_descriptor_limit();
  auto engine = std::make_shared<Engine>();
  engine->key = std::move(options.key);
  engine->identity = std::move(options.identity);
  engine->limits = options.limits;
  engine->handler = std::move(handler);
  engine->candidates = port_candidates(engine->key, options.port_low, options.port_high);
  for (auto& [name, text] : options.hosts) {
    Address a;
    if (!numeric(text, 0, a)) {
      error = "the address of " + name + ", '" + text + "', is not a numeric IPv4 address";
      return nullptr;
    }
    engine->allowed.insert(reinterpret_cast<sockaddr_in*>(&a.addr)->sin_addr.s_addr);
  }
  engine->hosts = std::move(options.hosts);
  // The worker is made with UCS_THREAD_MODE_SINGLE, so only the thread that
  // made it may use it (a UCX built with assertions, as Debian 13's is,
  // aborts the process otherwise): the progress thread makes it, runs it and
  // destroys it; this thread waits for the first step's outcome.
  std::promise<bool> made;
  std::future<bool> ready = made.get_future();
  engine->thread = std::thread([e = engine.get(), made = std::move(made),
                                bind = options.bind_address, port = options.port]() mutable {
    bool ok = e->init(bind, port, e->init_error);
    made.set_value(ok);
    if (ok) e->run();
    e->shutdown();
  });
  if (!ready.get()) {
    engine->thread.join();
    error = engine->init_error;
    return nullptr;
  }
  return std::unique_ptr<Peers>(new Peers(std::move(engine)));
}

Peers::~Peers() {
  {
    std::lock_guard lock(engine_->queue_mutex);
    engine_->stopping = true;
  }
  uint64_t one = 1;
  (void)!write(engine_->wake_fd, &one, sizeof one);
  engine_->thread.join();  // which shut the engine down
}

uint16_t Peers::port() const {
  return engine_->port;
}

std::string Peers::worker_address() const {
  return engine_->worker_address;
}

Held Peers::held() const {
  const detail::Tally& t = engine_->tally;
  return {t.answers.load(),    t.bytes.load(), t.peak_answers.load(),
          t.peak_bytes.load(), t.busy.load(),  t.too_large.load()};
}

Status Peers::call(const std::string& host, uint16_t port, std::string_view request,
                   std::vector<char>& reply, int timeout_ms, size_t max_reply) {
  reply.clear();
  if (request.size() > kMaxRequest)
    return {Code::error, "a request of " + std::to_string(request.size()) + " bytes (at most " +
                             std::to_string(kMaxRequest) + ")"};
  auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  Engine* engine = engine_.get();
  if (!port && engine->candidates.empty())
    return {Code::error, "no port to call " + host + " on (no port range)"};
  // The port asked for, or the job's candidates in this call's order.
  std::vector<size_t> order = port ? std::vector<size_t>{} : engine->search_order(host);
  std::vector<uint16_t> ports{port};
  if (!port) {
    ports.clear();
    for (size_t i : order) ports.push_back(engine->candidates[i]);
  }
  auto call = std::make_shared<Call>();
  Status status{Code::unreachable, "no session"};
  // A session made already, on any of them; else a handshake with each in
  // turn. A candidate has at most 250 ms, and a share of the time left as
  // though at most 4 were left (the first, the likely one, gets 250 ms of a
  // 1 s call on a loaded node), the last one all that is left: a port that
  // takes the connection and stays silent (a squatter) leaves the next ones
  // their time.
  {
    std::lock_guard guard(engine->sessions_mutex);
    for (uint16_t candidate : ports) {
      auto it = engine->sessions.find(host + ":" + std::to_string(candidate));
      if (it == engine->sessions.end()) continue;
      call->session = it->second;
      call->peer = it->first;
      status = {};
      break;
    }
  }
  if (!status.ok()) {
    Status first;  // the first failure other than `unreachable` (a port nobody has), else the first
    size_t tried = 0;
    for (; !status.ok() && tried < ports.size() && Clock::now() < deadline; ++tried) {
      auto now = Clock::now();
      size_t left = ports.size() - tried;
      auto share = left == 1 ? deadline
                             : std::min(now + (deadline - now) / long(std::min<size_t>(left, 4)),
                                        now + std::chrono::milliseconds(250));
      // Never a share too short for a handshake: a short call tries fewer
      // candidates (the next call goes on from there), so that squatters on
      // the candidates before a job's port cannot leave it slivers of every call.
      share = std::min(std::max(share, now + std::chrono::milliseconds(kMinTryMs)), deadline);
      status = engine->session_for(host, ports[tried], share, call->session);
      if (status.ok()) call->peer = host + ":" + std::to_string(ports[tried]);
      if (status.code == Code::error) return status;
      if (tried == 0 || (first.code == Code::unreachable && status.code != Code::unreachable))
        first = status;
    }
    if (!port) engine->searched(host, order, tried, status.ok());
    if (!status.ok() && tried == 0) return {Code::timeout, "no answer from " + host + " in time"};
    if (!status.ok() && port) return first;
    if (!status.ok())
      return {first.code, first.text + " (" + std::to_string(tried) + " of the job's " +
                              std::to_string(engine->candidates.size()) +
                              " port candidates tried)"};
  }
  call->max_reply = max_reply;
  call->deadline = deadline;
  call->host = host;
  call->reply = std::move(reply);
  call->reply.clear();
  call->request.assign(request);

  if (!engine->post([engine, call] { engine->start_call(call); }))
    return {Code::error, "peer transport stopped"};
  {
    std::unique_lock lock(call->m);
    if (!call->cv.wait_until(lock, call->deadline, [&] { return call->done; })) {
      call->done = true;
      call->status = {Code::timeout,
                      "no answer from " + call->peer + " in " + std::to_string(timeout_ms) + " ms"};
    }
    if (!call->received) {
      auto heard = Clock::time_point(Clock::duration(call->session.heard->load()));
      if (call->status.code == Code::timeout &&
          Clock::now() - heard >= std::chrono::milliseconds(engine->limits.silent_session_ms))
        engine->end_silent(call->peer, call->session.id);
      return call->status;
    }
  }
  // Received by rendezvous: verified here, on the caller's thread, before a
  // byte is taken.
  Mac expected;
  if (!call->verified &&
      (!answer_mac(engine->key, call->session.nonce, call->seq, call->id, call->answer,
                   {call->reply.data(), call->reply.size()}, expected) ||
       !same_mac(expected, call->mac)))
    return {Code::refused, call->peer + ": answer not signed with this job's key"};
  call->session.heard->store(Clock::now().time_since_epoch().count());
  if (call->answer == kAnswerOk) {
    reply = std::move(call->reply);
    return {};
  }
  std::string text(call->reply.begin(), call->reply.end());
  return {call->answer == kAnswerBusy ? Code::busy : Code::error, call->peer + ": " + text};
}

}  // namespace monarch::peers
