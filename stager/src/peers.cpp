#include "peers.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
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

// The destination goes in with its length: "node1" + "2..." and "node12" +
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

uint64_t connect_token(std::string_view key) {
  Mac mac{};
  hmac(key, {"monarch-connect"}, mac);
  uint64_t token = 0;
  for (size_t i = 0; i < 8; ++i) token |= uint64_t(mac[i]) << (8 * i);
  return token;
}

bool same_mac(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
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
  return out.magic == kMagic && out.answer <= kAnswerRefused;
}

bool decode_challenge(const void* header, size_t header_length, size_t length, Challenge& out) {
  out = {};
  if (header_length != sizeof out || length != 0) return false;
  std::memcpy(&out, header, sizeof out);
  return out.magic == kMagic && out.reserved == 0;
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
// end of a buffer when it accepts a connection over IPv6 on a TCP interface
// (valgrind: uct_tcp_ep_set_dest_addr from ucp_ep_create_server_accept), and
// the default listener (0.0.0.0) takes IPv4 alone, so a node name whose
// first address is IPv6 would be called where nobody listens.
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

std::string text_of(uint32_t ipv4) {
  in_addr a{ipv4};
  char text[INET_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET, &a, text, sizeof text);
  return text;
}

// One call, shared by the calling thread (which waits on it until the
// deadline, then verifies the answer) and the progress thread (which
// receives it). The first finish() wins; `reply`, `answer` and `mac` are
// written by the progress thread only before it finishes, and read by the
// caller only after a `received` finish.
struct Call {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  bool received = false;  // an answer is in reply, not verified yet
  Status status;
  std::vector<char> reply;
  uint32_t answer = 0;
  Mac mac{};  // the answer's
  size_t max_reply = 0;
  std::string request;
  std::string host;  // the destination, which the request's MAC covers
  std::string peer;  // "host:port"
  Address address;
  Clock::time_point deadline;
  // The progress thread's only, until the answer is received.
  uint64_t id = 0;
  uint64_t conn = 0;
  uint64_t seq = 0;
  Nonce nonce{};

  void finish(Code code, std::string text) {
    std::lock_guard lock(m);
    if (done) return;
    done = true;
    status = {code, std::move(text)};
    cv.notify_all();
  }
  void receive(uint32_t code, const Mac& answer_mac) {
    std::lock_guard lock(m);
    if (done) return;
    done = received = true;
    answer = code;
    mac = answer_mac;
    cv.notify_all();
  }
};

struct Conn {
  ucp_ep_h ep = nullptr;
  bool server = false;  // accepted by our listener (else: we called)
  bool refused = false;
  std::string peer;
  Nonce nonce{};  // the server's challenge
  // Ours (we called): the challenge came; the next sequence number; the calls
  // waiting on this connection, and those waiting for the challenge.
  bool ready = false;
  uint64_t next_seq = 1;
  std::unordered_set<uint64_t> calls;
  std::vector<uint64_t> before_challenge;
  // Accepted: the caller's address, when, whether it sent a valid request,
  // the sequence numbers it used, its requests being served.
  uint32_t source = 0;
  Clock::time_point opened;
  bool authenticated = false;
  Window window;
  unsigned in_flight = 0;
};

}  // namespace

namespace detail {

struct Engine : std::enable_shared_from_this<Engine> {
  std::string key;
  std::string identity;
  uint64_t token = 0;  // connect_token(key)
  Limits limits;
  std::unordered_set<uint32_t> allowed;  // IPv4, network order; empty: any
  Handler handler;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  uint16_t port = 0;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::thread thread;

  // Shared with every thread.
  std::mutex queue_mutex;
  std::deque<std::function<void()>> queue;
  bool stopping = false;
  std::mutex resolved_mutex;
  std::map<std::string, Address> resolved;   // "host:port"
  std::map<std::string, std::string> hosts;  // Options::hosts, never changed

  // The progress thread's only.
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, Conn> conns;
  std::unordered_map<ucp_ep_h, uint64_t> by_ep;
  std::unordered_map<std::string, uint64_t> called;  // "host:port" -> our connection to it
  std::unordered_map<uint64_t, std::shared_ptr<Call>> calls;
  std::vector<std::function<void()>> later;  // UCX work that UCX callbacks may not do
  std::vector<void*> closing;                // ucp_ep_close_nbx requests in flight
  Clock::time_point next_sweep;
  unsigned unauthenticated = 0;  // accepted connections not authenticated yet

  ~Engine() {
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

  bool init(const std::string& bind_address, uint16_t want_port, std::string& error);
  void run();
  void shutdown();

  void start_call(const std::shared_ptr<Call>& call);
  void send_request(Conn& conn, uint64_t call_id);
  void send_answer(uint64_t conn, uint64_t call, const AnswerHeader& header,
                   std::vector<char> bytes, std::shared_ptr<void> hold);
  void sign_and_send(uint64_t conn, uint64_t call, uint64_t seq, uint32_t answer, std::string text);
  void refuse(uint64_t conn, uint64_t call, uint64_t seq, std::string why);
  void accept(ucp_conn_request_h request);
  void authenticated(uint64_t conn);
  void drop(uint64_t conn);
  void fail_conn(uint64_t id, const std::string& why, Code code = Code::unreachable);
  void close_ep(ucp_ep_h ep, bool force);
  void sweep();

  static void on_conn_request(ucp_conn_request_h request, void* arg);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_request(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_answer(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_challenge(void* arg, const void* header, size_t header_length, void* data,
                                   size_t length, const ucp_am_recv_param_t* param);
  void dispatch(uint64_t conn, uint64_t call, uint64_t seq, std::vector<char> request);
};

}  // namespace detail

using detail::Engine;

namespace {

// What a send keeps alive until UCX is done with its buffers.
struct SendContext {
  Engine* engine;
  std::string header;
  std::vector<char> payload;   // an answer's bytes
  std::shared_ptr<Call> call;  // a request's (its bytes, and whom to tell of a failure)
  std::shared_ptr<void> hold;  // Reply::send's
};

// A request that cannot be sent fails its call and its connection (the next
// call connects again), whether or not UCX also reports the endpoint broken.
void request_failed(SendContext* ctx, ucs_status_t status);

void on_sent(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<SendContext*>(user_data);
  if (status != UCS_OK && ctx->call) request_failed(ctx, status);
  delete ctx;
  ucp_request_free(request);
}

// Posts an active message; ctx is owned by UCX until it completes.
void send_am(ucp_ep_h ep, unsigned id, const void* payload, size_t size, uint32_t flags,
             SendContext* ctx) {
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = on_sent;
  param.user_data = ctx;
  param.flags = flags;
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

void on_received(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* ctx = static_cast<ReceiveContext*>(user_data);
  if (status == UCS_OK)
    ctx->call->receive(ctx->answer, ctx->mac);
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
  // A stager restarted on its port must get it back while the connections of
  // the one before linger in TIME_WAIT (SO_REUSEADDR on the listener; Linux
  // still refuses a second listener on a port in use).
  for (auto [name, value] : {std::pair{"TLS", "^sm"}, {"CM_REUSEADDR", "y"}}) {
    if (getenv(("UCX_" + std::string(name)).c_str()) != nullptr) continue;
    status = ucp_config_modify(config, name, value);
    if (status != UCS_OK) {
      ucp_config_release(config);
      error = std::string("UCX configuration ") + name + "=" + value + ": " + ucx_text(status);
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
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_CLIENT_ID;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // the progress thread only
  worker_params.client_id = token;                     // sent with each connection we open
  status = ucp_worker_create(context, &worker_params, &worker);
  if (status != UCS_OK) {
    error = "UCX worker: " + ucx_text(status);
    return false;
  }
  for (auto [id, cb] : {std::pair{kRequestAm, &Engine::on_request},
                        {kAnswerAm, &Engine::on_answer},
                        {kChallengeAm, &Engine::on_challenge}}) {
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

  Address address;
  if (!numeric(bind_address, want_port, address) &&
      !resolve(bind_address, want_port, true, address, error))
    return false;
  ucp_listener_params_t listen{};
  listen.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  listen.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address.addr);
  listen.sockaddr.addrlen = address.len;
  listen.conn_handler.cb = on_conn_request;
  listen.conn_handler.arg = this;
  status = ucp_listener_create(worker, &listen, &listener);
  if (status != UCS_OK) {
    error =
        "listening on " + bind_address + ":" + std::to_string(want_port) + ": " + ucx_text(status);
    return false;
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  status = ucp_listener_query(listener, &attr);
  if (status != UCS_OK) {
    error = "UCX listener query: " + ucx_text(status);
    return false;
  }
  port = ntohs(reinterpret_cast<sockaddr_in*>(&attr.sockaddr)->sin_port);  // IPv4: resolve()

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
  for (int fd : {worker_fd, wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      error = std::string("epoll: ") + strerror(errno);
      return false;
    }
  }
  return true;
}

// The progress loop: our queue, then UCX until idle, then sleep on both
// descriptors. Wakes every 20 ms while calls wait or connections are not
// authenticated yet (to forget calls past their deadline, whose callers never
// wait on this thread, and to drop connections past theirs), else every 200 ms.
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
    if (!work.empty()) continue;
    if (ucp_worker_arm(worker) == UCS_ERR_BUSY) continue;
    epoll_event events[2];
    bool busy = !calls.empty() || !closing.empty() || unauthenticated > 0;
    epoll_wait(epoll_fd, events, 2, busy ? 20 : 200);
    uint64_t count;
    (void)!read(wake_fd, &count, sizeof count);
  }
}

// After run() returned: every call fails, every connection closes (forced:
// answers not sent are dropped), then UCX goes.
void Engine::shutdown() {
  for (auto& [id, call] : calls) call->finish(Code::error, "peer transport stopped");
  calls.clear();
  if (listener) ucp_listener_destroy(listener);
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
// forgotten (an answer arriving later is dropped). Accepted connections
// without a valid request in time are dropped. Closes that completed are
// freed.
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
  if (unauthenticated > 0) {
    std::vector<uint64_t> late;
    for (auto& [id, conn] : conns)
      if (conn.server && !conn.authenticated &&
          now - conn.opened > std::chrono::milliseconds(limits.auth_ms))
        late.push_back(id);
    for (uint64_t id : late) drop(id);
  }
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

// An accepted connection closed at once, unanswered.
void Engine::drop(uint64_t id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  if (it->second.server && !it->second.authenticated) --unauthenticated;
  close_ep(it->second.ep, true);
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
  if (!conn.server) called.erase(conn.peer);
  drop(id);
}

void Engine::start_call(const std::shared_ptr<Call>& call) {
  {
    std::lock_guard lock(call->m);
    if (call->done) return;  // its caller gave up while it waited in the queue
  }
  uint64_t conn_id;
  if (auto it = called.find(call->peer); it != called.end()) {
    conn_id = it->second;
  } else {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&call->address.addr);
    params.sockaddr.addrlen = call->address.len;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = on_ep_error;
    params.err_handler.arg = this;
    ucp_ep_h ep;
    ucs_status_t status = ucp_ep_create(worker, &params, &ep);
    if (status != UCS_OK) {
      call->finish(Code::unreachable, "connecting to " + call->peer + ": " + ucx_text(status));
      return;
    }
    conn_id = next_id++;
    Conn& conn = conns[conn_id];
    conn.ep = ep;
    conn.peer = call->peer;
    by_ep[ep] = conn_id;
    called[call->peer] = conn_id;
  }
  uint64_t call_id = next_id++;
  call->id = call_id;
  call->conn = conn_id;
  calls[call_id] = call;
  Conn& conn = conns[conn_id];
  conn.calls.insert(call_id);
  if (conn.ready)
    send_request(conn, call_id);
  else
    conn.before_challenge.push_back(call_id);
}

// Signed here, with the connection's challenge and its next sequence number.
void Engine::send_request(Conn& conn, uint64_t call_id) {
  auto it = calls.find(call_id);
  if (it == calls.end()) return;  // given up meanwhile
  std::shared_ptr<Call> call = it->second;
  call->seq = conn.next_seq++;
  call->nonce = conn.nonce;
  RequestHeader header{kMagic, 0, call_id, call->seq, {}};
  if (!request_mac(key, conn.nonce, call->seq, call_id, call->host, call->request, header.mac))
    return call->finish(Code::error, "HMAC-SHA256 (OpenSSL) failed");
  auto* ctx = new SendContext{this, {}, {}, call, {}};
  ctx->header.assign(reinterpret_cast<const char*>(&header), sizeof header);
  send_am(conn.ep, kRequestAm, call->request.data(), call->request.size(), UCP_AM_SEND_FLAG_REPLY,
          ctx);
}

// Answers carry the reply flag: the caller checks they came back on the
// connection its request went out on.
void Engine::send_answer(uint64_t conn_id, uint64_t call_id, const AnswerHeader& header,
                         std::vector<char> bytes, std::shared_ptr<void> hold) {
  (void)call_id;
  auto it = conns.find(conn_id);
  if (it == conns.end()) return;  // the caller is gone: nobody to tell
  Conn& conn = it->second;
  if (conn.in_flight > 0) --conn.in_flight;
  auto* ctx = new SendContext{this, {}, std::move(bytes), nullptr, std::move(hold)};
  ctx->header.assign(reinterpret_cast<const char*>(&header), sizeof header);
  send_am(conn.ep, kAnswerAm, ctx->payload.data(), ctx->payload.size(), UCP_AM_SEND_FLAG_REPLY,
          ctx);
}

// An answer made on the progress thread: short texts only.
void Engine::sign_and_send(uint64_t conn_id, uint64_t call_id, uint64_t seq, uint32_t answer,
                           std::string text) {
  auto it = conns.find(conn_id);
  if (it == conns.end()) return;
  AnswerHeader header{kMagic, answer, call_id, {}};
  // All zeros if OpenSSL failed: the caller takes it for a stranger's.
  answer_mac(key, it->second.nonce, seq, call_id, answer, text, header.mac);
  ++it->second.in_flight;  // send_answer counts it out
  send_answer(conn_id, call_id, header, {text.begin(), text.end()}, {});
}

// Told why, then closed: the caller learns it was refused rather than that
// the connection broke. Nothing it sends later is read.
void Engine::refuse(uint64_t conn_id, uint64_t call_id, uint64_t seq, std::string why) {
  auto it = conns.find(conn_id);
  if (it == conns.end() || it->second.refused) return;
  it->second.refused = true;
  later.push_back([this, conn_id, call_id, seq, why = std::move(why)] {
    sign_and_send(conn_id, call_id, seq, kAnswerRefused, why);
    auto it = conns.find(conn_id);
    if (it == conns.end()) return;
    if (it->second.server && !it->second.authenticated) --unauthenticated;
    close_ep(it->second.ep, false);  // flushes the answer first
    conns.erase(it);
  });
}

void Engine::on_conn_request(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<Engine*>(arg);
  self->later.push_back([self, request] { self->accept(request); });
}

// Only the job's addresses with the job's token get an endpoint; a new
// connection takes the place of the oldest one not authenticated yet, from
// its address, then from any, when those are at their bound.
void Engine::accept(ucp_conn_request_h request) {
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR | UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;
  uint32_t source = 0;
  bool good = ucp_conn_request_query(request, &attr) == UCS_OK &&
              attr.client_address.ss_family == AF_INET && attr.client_id == token;
  if (good) source = reinterpret_cast<sockaddr_in*>(&attr.client_address)->sin_addr.s_addr;
  if (!good || (!allowed.empty() && !allowed.count(source))) {
    ucp_listener_reject(listener, request);
    return;
  }
  auto oldest_unauthenticated = [&](bool same_source, unsigned& count) {
    uint64_t oldest = 0;
    Clock::time_point when = Clock::time_point::max();
    count = 0;
    for (auto& [id, conn] : conns) {
      if (!conn.server || conn.authenticated || (same_source && conn.source != source)) continue;
      ++count;
      if (conn.opened < when) when = conn.opened, oldest = id;
    }
    return oldest;
  };
  unsigned count;
  uint64_t oldest = oldest_unauthenticated(true, count);
  if (count >= limits.unauthenticated_per_source && oldest) drop(oldest);
  oldest = oldest_unauthenticated(false, count);
  if (count >= limits.unauthenticated && oldest) drop(oldest);

  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = on_ep_error;
  params.err_handler.arg = this;
  ucp_ep_h ep;
  if (ucp_ep_create(worker, &params, &ep) != UCS_OK) return;
  uint64_t id = next_id++;
  Conn& conn = conns[id];
  conn.ep = ep;
  conn.server = true;
  conn.peer = "a caller at " + text_of(source);
  conn.source = source;
  conn.opened = Clock::now();
  ++unauthenticated;
  by_ep[ep] = id;
  if (getrandom(conn.nonce.data(), conn.nonce.size(), 0) != ssize_t(conn.nonce.size()))
    return drop(id);
  Challenge challenge{kMagic, 0, conn.nonce};
  auto* ctx = new SendContext{this, {}, {}, nullptr, {}};
  ctx->header.assign(reinterpret_cast<const char*>(&challenge), sizeof challenge);
  send_am(ep, kChallengeAm, nullptr, 0, UCP_AM_SEND_FLAG_REPLY, ctx);
}

// Its first valid request: no longer counted among the unauthenticated; the
// oldest authenticated connection from its address goes when there are too
// many (a stager that restarted replaces its old connection).
void Engine::authenticated(uint64_t id) {
  Conn& conn = conns[id];
  conn.authenticated = true;
  --unauthenticated;
  uint64_t oldest = 0;
  unsigned count = 0;
  Clock::time_point when = Clock::time_point::max();
  for (auto& [other, c] : conns) {
    if (!c.server || !c.authenticated || c.source != conn.source) continue;
    ++count;
    if (other != id && c.opened < when) when = c.opened, oldest = other;
  }
  if (count > limits.authenticated_per_source && oldest) drop(oldest);
}

void Engine::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<Engine*>(arg);
  auto it = self->by_ep.find(ep);
  if (it == self->by_ep.end()) return;
  uint64_t id = it->second;
  self->later.push_back([self, id, status] {
    auto conn = self->conns.find(id);
    if (conn == self->conns.end()) return;
    // Rejected: the listener there is not of this job (another connection
    // token), or does not take this node's address for one of the job's.
    if (status == UCS_ERR_REJECTED)
      return self->fail_conn(id,
                             conn->second.peer +
                                 " rejected the connection (not a stager of "
                                 "this job, or not from one of its nodes)",
                             Code::refused);
    self->fail_conn(id, "connection to " + conn->second.peer + " lost: " + ucx_text(status));
  });
}

// Our connection's challenge: the calls waiting for it go out.
ucs_status_t Engine::on_challenge(void* arg, const void* header, size_t header_length,
                                  void* /*data*/, size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Engine*>(arg);
  Challenge c;
  if (!decode_challenge(header, header_length, length, c) ||
      !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
    return UCS_OK;
  auto by_ep = self->by_ep.find(param->reply_ep);
  if (by_ep == self->by_ep.end()) return UCS_OK;
  Conn& conn = self->conns[by_ep->second];
  if (conn.server || conn.ready) return UCS_OK;  // one challenge, from the side we called
  conn.nonce = c.nonce;
  conn.ready = true;
  for (uint64_t call_id : std::exchange(conn.before_challenge, {}))
    self->send_request(conn, call_id);
  return UCS_OK;
}

// A request is served only if it decodes, is fresh on its connection, and
// its MAC verifies for this stager's key, identity and the connection's
// challenge. Nothing of a request by rendezvous is received.
ucs_status_t Engine::on_request(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Engine*>(arg);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
  auto by_ep = self->by_ep.find(param->reply_ep);
  if (by_ep == self->by_ep.end()) return UCS_OK;
  uint64_t conn_id = by_ep->second;
  Conn& conn = self->conns[conn_id];
  if (conn.refused) return UCS_OK;
  if (!conn.server) {  // requests come to our listener, never back on our calls
    self->later.push_back([self, conn_id] {
      self->fail_conn(conn_id, "a request came back on a connection this stager opened");
    });
    return UCS_OK;
  }
  RequestHeader h;
  std::string why;
  if (!decode_request(header, header_length, length, param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV,
                      h, why)) {
    self->refuse(conn_id, h.call, h.seq, "refused: " + why);
    return UCS_OK;
  }
  if (!conn.window.fresh(h.seq)) {
    self->refuse(conn_id, h.call, h.seq,
                 "refused: request " + std::to_string(h.seq) + " on this connection already seen");
    return UCS_OK;
  }
  std::string_view request(static_cast<const char*>(data), length);
  Mac expected;
  if (!request_mac(self->key, conn.nonce, h.seq, h.call, self->identity, request, expected) ||
      !same_mac(expected, h.mac)) {
    self->refuse(conn_id, h.call, h.seq,
                 "refused: not signed with this job's key for '" + self->identity + "'");
    return UCS_OK;
  }
  conn.window.take(h.seq);
  if (!conn.authenticated) self->authenticated(conn_id);
  if (conn.in_flight >= self->limits.in_flight) {
    self->later.push_back([self, conn_id, call = h.call, seq = h.seq] {
      self->sign_and_send(conn_id, call, seq, kAnswerError, "busy: too many requests at once");
    });
    return UCS_OK;
  }
  ++conn.in_flight;
  self->dispatch(conn_id, h.call, h.seq, std::vector<char>(request.begin(), request.end()));
  return UCS_OK;
}

ucs_status_t Engine::on_answer(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Engine*>(arg);
  AnswerHeader h;
  if (!decode_answer(header, header_length, h) ||
      !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP))
    return UCS_OK;
  // Only on the connection the request went out on (our client side): one
  // that someone opened to our listener cannot answer our calls.
  auto by_ep = self->by_ep.find(param->reply_ep);
  auto it = self->calls.find(h.call);
  if (by_ep == self->by_ep.end() || it == self->calls.end()) return UCS_OK;  // late: given up
  if (it->second->conn != by_ep->second || it->second->seq == 0) return UCS_OK;
  std::shared_ptr<Call> call = it->second;
  self->calls.erase(it);
  if (auto conn = self->conns.find(call->conn); conn != self->conns.end())
    conn->second.calls.erase(h.call);

  if (length > call->max_reply) {
    call->finish(Code::error, call->peer + ": answer of " + std::to_string(length) +
                                  " bytes, more than the " + std::to_string(call->max_reply) +
                                  " asked for");
    return UCS_OK;
  }
  // Received whole, then verified by the caller before it takes a byte.
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    call->reply.resize(length);
    receive_rndv(self, data, call->reply.data(), length, new ReceiveContext{call, h.answer, h.mac});
    return UCS_INPROGRESS;
  }
  const char* bytes = static_cast<const char*>(data);
  call->reply.assign(bytes, bytes + length);
  call->receive(h.answer, h.mac);
  return UCS_OK;
}

void Engine::dispatch(uint64_t conn, uint64_t call, uint64_t seq, std::vector<char> request) {
  Reply reply;
  reply.engine_ = weak_from_this();
  reply.conn_ = conn;
  reply.call_ = call;
  reply.seq_ = seq;
  reply.nonce_ = conns[conn].nonce;
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
    conn_ = other.conn_;
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

// Signed on this thread: the progress thread only sends.
void Reply::answer(uint32_t code, std::vector<char> bytes, std::shared_ptr<void> hold) {
  if (!armed_) return;
  armed_ = false;
  std::shared_ptr<Engine> engine = engine_.lock();
  if (!engine) return;
  AnswerHeader header{kMagic, code, call_, {}};
  // All zeros if OpenSSL failed: the caller takes it for a stranger's.
  answer_mac(engine->key, nonce_, seq_, call_, code, {bytes.data(), bytes.size()}, header.mac);
  Engine* raw = engine.get();  // the queue runs only while the engine lives
  raw->post([raw, conn = conn_, call = call_, header, bytes = std::move(bytes),
             hold = std::move(hold)]() mutable {
    raw->send_answer(conn, call, header, std::move(bytes), std::move(hold));
  });
}

Peers::Peers(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}

std::unique_ptr<Peers> Peers::start(Options options, Handler handler, std::string& error) {
  auto engine = std::make_shared<Engine>();
  engine->key = std::move(options.key);
  engine->identity = std::move(options.identity);
  engine->token = connect_token(engine->key);
  engine->limits = options.limits;
  engine->handler = std::move(handler);
  for (auto& [name, text] : options.hosts) {
    Address a;
    if (!numeric(text, 0, a)) {
      error = "the address of " + name + ", '" + text + "', is not a numeric IPv4 address";
      return nullptr;
    }
    engine->allowed.insert(reinterpret_cast<sockaddr_in*>(&a.addr)->sin_addr.s_addr);
  }
  engine->hosts = std::move(options.hosts);
  if (!engine->init(options.bind_address, options.port, error)) {
    engine->shutdown();
    return nullptr;
  }
  engine->thread = std::thread([e = engine.get()] { e->run(); });
  return std::unique_ptr<Peers>(new Peers(std::move(engine)));
}

Peers::~Peers() {
  {
    std::lock_guard lock(engine_->queue_mutex);
    engine_->stopping = true;
  }
  uint64_t one = 1;
  (void)!write(engine_->wake_fd, &one, sizeof one);
  engine_->thread.join();
  engine_->shutdown();
}

uint16_t Peers::port() const {
  return engine_->port;
}

Status Peers::call(const std::string& host, uint16_t port, std::string_view request,
                   std::vector<char>& reply, int timeout_ms, size_t max_reply) {
  reply.clear();
  if (request.size() > kMaxRequest)
    return {Code::error, "a request of " + std::to_string(request.size()) + " bytes (at most " +
                             std::to_string(kMaxRequest) + ")"};
  auto call = std::make_shared<Call>();
  call->max_reply = max_reply;
  call->deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  call->host = host;
  call->peer = host + ":" + std::to_string(port);
  call->reply = std::move(reply);
  call->reply.clear();
  {
    std::lock_guard lock(engine_->resolved_mutex);
    auto it = engine_->resolved.find(call->peer);
    if (it != engine_->resolved.end()) call->address = it->second;
  }
  if (call->address.len == 0) {
    std::string error;
    auto known = engine_->hosts.find(host);
    if (known != engine_->hosts.end() ? !numeric(known->second, port, call->address)
                                      : !resolve(host, port, false, call->address, error))
      return {Code::unreachable, error.empty() ? "no address for " + host : error};
    std::lock_guard lock(engine_->resolved_mutex);
    engine_->resolved[call->peer] = call->address;
  }
  call->request.assign(request);

  Engine* engine = engine_.get();
  if (!engine->post([engine, call] { engine->start_call(call); }))
    return {Code::error, "peer transport stopped"};
  {
    std::unique_lock lock(call->m);
    if (!call->cv.wait_until(lock, call->deadline, [&] { return call->done; })) {
      call->done = true;
      call->status = {Code::timeout,
                      "no answer from " + call->peer + " in " + std::to_string(timeout_ms) + " ms"};
    }
    if (!call->received) return call->status;
  }
  // Received: verified here, on the caller's thread, before a byte is taken.
  Mac expected;
  if (!answer_mac(engine->key, call->nonce, call->seq, call->id, call->answer,
                  {call->reply.data(), call->reply.size()}, expected) ||
      !same_mac(expected, call->mac))
    return {Code::refused, call->peer + ": answer not signed with this job's key"};
  if (call->answer == kAnswerOk) {
    reply = std::move(call->reply);
    return {};
  }
  std::string text(call->reply.begin(), call->reply.end());
  return {call->answer == kAnswerRefused ? Code::refused : Code::error, call->peer + ": " + text};
}

}  // namespace monarch::peers
