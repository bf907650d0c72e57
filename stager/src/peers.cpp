#include "peers.h"

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

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

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

namespace {

using Clock = std::chrono::steady_clock;

using namespace wire;

// The longest request a stager reads. Its bytes are read before its MAC can be
// checked, so this is what a stranger can make a stager hold per request.
constexpr size_t kMaxRequest = Peers::kDefaultMaxReply;

using Mac = std::array<unsigned char, 32>;

// HMAC-SHA256(key, the parts one after another). False if OpenSSL fails: then
// nothing is signed nor verifies.
bool hmac(std::string_view key, std::initializer_list<std::string_view> parts, Mac& out) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
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
  EVP_MAC_free(mac);
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

// The destination goes in with its length: "node1" + "2..." and "node12" +
// "..." sign differently.
bool request_mac(std::string_view key, uint64_t nonce, std::string_view destination,
                 std::string_view request, Mac& out) {
  return hmac(
      key, {"monarch-request", Le<8>(nonce), Le<4>(destination.size()), destination, request}, out);
}

bool answer_mac(std::string_view key, uint64_t nonce, uint64_t call, uint32_t answer,
                uint64_t length, Mac& out) {
  return hmac(key, {"monarch-answer", Le<8>(nonce), Le<8>(call), Le<4>(answer), Le<8>(length)},
              out);
}

// In constant time, whatever the bytes compared.
bool same_mac(const Mac& expected, const unsigned char (&got)[32]) {
  return CRYPTO_memcmp(expected.data(), got, expected.size()) == 0;
}

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

// One call, shared by the calling thread (which waits on it until the
// deadline) and the progress thread (which answers it). The first finish()
// wins; `reply` is written by the progress thread only before it finishes,
// and read by the caller only after an ok finish.
struct Call {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::vector<char> reply;
  size_t max_reply = 0;
  std::string request;
  uint64_t nonce = 0;
  Mac mac{};         // of the request, for host
  std::string peer;  // "host:port"
  Address address;
  Clock::time_point deadline;
  uint64_t conn = 0;  // progress thread only

  void finish(Code code, std::string text) {
    std::lock_guard lock(m);
    if (done) return;
    done = true;
    status = {code, std::move(text)};
    cv.notify_all();
  }
};

struct Conn {
  ucp_ep_h ep = nullptr;
  bool server = false;  // accepted by our listener (else: we called)
  bool refused = false;
  std::string peer;
  std::unordered_set<uint64_t> calls;  // ours, waiting on this connection
};

}  // namespace

namespace detail {

struct Engine : std::enable_shared_from_this<Engine> {
  std::string key;
  std::string identity;
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
  std::map<std::string, Address> resolved;

  // The progress thread's only.
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, Conn> conns;
  std::unordered_map<ucp_ep_h, uint64_t> by_ep;
  std::unordered_map<std::string, uint64_t> called;  // "host:port" -> our connection to it
  std::unordered_map<uint64_t, std::shared_ptr<Call>> calls;
  std::vector<std::function<void()>> later;  // UCX work that UCX callbacks may not do
  std::vector<void*> closing;                // ucp_ep_close_nbx requests in flight
  Clock::time_point next_sweep;

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
  void send_answer(uint64_t conn, uint64_t call, uint64_t nonce, uint32_t answer,
                   std::vector<char> bytes);
  void refuse(uint64_t conn, uint64_t call, uint64_t nonce, std::string why);
  void verify(uint64_t conn, const RequestHeader& h, std::vector<char> request);
  void fail_conn(uint64_t id, const std::string& why);
  void close_ep(ucp_ep_h ep, bool force);
  void sweep();

  static void on_conn_request(ucp_conn_request_h request, void* arg);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t on_request(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t on_answer(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  void dispatch(uint64_t conn, uint64_t call, uint64_t nonce, std::vector<char> request);
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

// A rendezvous receive in flight: the buffer it fills and what to do after.
struct ReceiveContext {
  Engine* engine;
  std::shared_ptr<Call> call;  // an answer's: received into call->reply
  std::vector<char> request;   // a request's, not verified yet
  uint64_t conn = 0;
  RequestHeader header{};
};

void on_received(void* request, ucs_status_t status, size_t length, void* user_data) {
  auto* ctx = static_cast<ReceiveContext*>(user_data);
  if (ctx->call) {
    if (status == UCS_OK)
      ctx->call->finish(Code::ok, {});
    else
      ctx->call->finish(Code::unreachable,
                        "receiving from " + ctx->call->peer + " failed: " + ucx_text(status));
  } else if (status == UCS_OK) {
    ctx->engine->verify(ctx->conn, ctx->header, std::move(ctx->request));
  }
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
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;  // the progress thread only
  status = ucp_worker_create(context, &worker_params, &worker);
  if (status != UCS_OK) {
    error = "UCX worker: " + ucx_text(status);
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

  Address address;
  if (!resolve(bind_address, want_port, true, address, error)) return false;
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
// descriptors. Wakes every 20 ms while calls wait (to forget those past
// their deadline; their callers never wait on this thread), else every 200 ms.
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
    epoll_wait(epoll_fd, events, 2, calls.empty() && closing.empty() ? 200 : 20);
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
// forgotten (an answer arriving later is dropped). Closes that completed are
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

void Engine::fail_conn(uint64_t id, const std::string& why) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  Conn& conn = it->second;
  for (uint64_t call_id : conn.calls) {
    auto call = calls.find(call_id);
    if (call == calls.end()) continue;
    call->second->finish(Code::unreachable, why);
    calls.erase(call);
  }
  if (!conn.server) called.erase(conn.peer);
  close_ep(conn.ep, true);
  conns.erase(it);
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
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
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
    conns[conn_id] = Conn{ep, false, false, call->peer, {}};
    by_ep[ep] = conn_id;
    called[call->peer] = conn_id;
  }
  uint64_t call_id = next_id++;
  call->conn = conn_id;
  calls[call_id] = call;
  Conn& conn = conns[conn_id];
  conn.calls.insert(call_id);

  auto* ctx = new SendContext{this, {}, {}, call};
  RequestHeader header{kMagic, 0, call_id, call->nonce, {}};
  std::memcpy(header.mac, call->mac.data(), sizeof header.mac);
  ctx->header.assign(reinterpret_cast<const char*>(&header), sizeof header);
  send_am(conn.ep, kRequestAm, call->request.data(), call->request.size(), UCP_AM_SEND_FLAG_REPLY,
          ctx);
}

// Answers carry the reply flag: the caller checks they came back on the
// connection its request went out on. Their MAC covers the header only.
void Engine::send_answer(uint64_t conn_id, uint64_t call_id, uint64_t nonce, uint32_t answer,
                         std::vector<char> bytes) {
  auto it = conns.find(conn_id);
  if (it == conns.end()) return;  // the caller is gone: nobody to tell
  AnswerHeader header{kMagic, answer, call_id, {}};
  Mac mac{};  // all zeros if OpenSSL failed: the caller takes it for a stranger's
  answer_mac(key, nonce, call_id, answer, bytes.size(), mac);
  std::memcpy(header.mac, mac.data(), sizeof header.mac);
  auto* ctx = new SendContext{this, {}, std::move(bytes), nullptr};
  ctx->header.assign(reinterpret_cast<const char*>(&header), sizeof header);
  send_am(it->second.ep, kAnswerAm, ctx->payload.data(), ctx->payload.size(),
          UCP_AM_SEND_FLAG_REPLY, ctx);
}

// Told why, then dropped: the caller learns it was refused rather than that
// the connection broke. Nothing it sends later is read.
void Engine::refuse(uint64_t conn_id, uint64_t call_id, uint64_t nonce, std::string why) {
  auto it = conns.find(conn_id);
  if (it == conns.end() || it->second.refused) return;
  it->second.refused = true;
  later.push_back([this, conn_id, call_id, nonce, why = std::move(why)] {
    send_answer(conn_id, call_id, nonce, kAnswerRefused, {why.begin(), why.end()});
    auto it = conns.find(conn_id);
    if (it == conns.end()) return;
    close_ep(it->second.ep, false);  // flushes the answer first
    conns.erase(it);
  });
}

// A request is served only if its MAC verifies for this stager's key and
// identity.
void Engine::verify(uint64_t conn_id, const RequestHeader& h, std::vector<char> request) {
  auto it = conns.find(conn_id);
  if (it == conns.end() || it->second.refused) return;
  Mac expected;
  if (!request_mac(key, h.nonce, identity, {request.data(), request.size()}, expected) ||
      !same_mac(expected, h.mac))
    return refuse(conn_id, h.call, h.nonce,
                  "refused: not signed with this job's key for '" + identity + "'");
  dispatch(conn_id, h.call, h.nonce, std::move(request));
}

void Engine::on_conn_request(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<Engine*>(arg);
  self->later.push_back([self, request] {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = on_ep_error;
    params.err_handler.arg = self;
    ucp_ep_h ep;
    if (ucp_ep_create(self->worker, &params, &ep) != UCS_OK) return;
    uint64_t id = self->next_id++;
    self->conns[id] = Conn{ep, true, false, "a caller", {}};
    self->by_ep[ep] = id;
  });
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

ucs_status_t Engine::on_request(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Engine*>(arg);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
  auto by_ep = self->by_ep.find(param->reply_ep);
  if (by_ep == self->by_ep.end()) return UCS_OK;
  uint64_t conn_id = by_ep->second;
  Conn& conn = self->conns[conn_id];
  if (conn.refused) return UCS_OK;

  RequestHeader h{};
  if (header_length == sizeof h) std::memcpy(&h, header, sizeof h);
  if (header_length != sizeof h || h.magic != kMagic) {
    self->refuse(conn_id, h.call, h.nonce, "refused: not a request of this version");
    return UCS_OK;
  }
  if (length > kMaxRequest) {
    self->refuse(conn_id, h.call, h.nonce,
                 "refused: a request of " + std::to_string(length) + " bytes");
    return UCS_OK;
  }
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    auto* ctx = new ReceiveContext{self, nullptr, std::vector<char>(length), conn_id, h};
    receive_rndv(self, data, ctx->request.data(), length, ctx);
    return UCS_INPROGRESS;
  }
  const char* bytes = static_cast<const char*>(data);
  self->verify(conn_id, h, std::vector<char>(bytes, bytes + length));
  return UCS_OK;
}

ucs_status_t Engine::on_answer(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<Engine*>(arg);
  AnswerHeader h{};
  if (header_length != sizeof h) return UCS_OK;
  std::memcpy(&h, header, sizeof h);
  if (h.magic != kMagic || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
  // Only on the connection the request went out on (our client side): one
  // that someone opened to our listener cannot answer our calls.
  auto by_ep = self->by_ep.find(param->reply_ep);
  auto it = self->calls.find(h.call);
  if (by_ep == self->by_ep.end() || it == self->calls.end()) return UCS_OK;  // late: given up
  if (it->second->conn != by_ep->second) return UCS_OK;
  std::shared_ptr<Call> call = it->second;
  self->calls.erase(it);
  if (auto conn = self->conns.find(call->conn); conn != self->conns.end())
    conn->second.calls.erase(h.call);

  Mac expected;
  if (!answer_mac(self->key, call->nonce, h.call, h.answer, length, expected) ||
      !same_mac(expected, h.mac)) {
    // Whoever listens there does not hold the key (another job's stager, or
    // a process that took the port first): nothing it sent is read.
    call->finish(Code::refused, call->peer + ": answer not signed with this job's key");
    return UCS_OK;
  }
  if (length > call->max_reply) {
    call->finish(Code::error, call->peer + ": answer of " + std::to_string(length) +
                                  " bytes, more than the " + std::to_string(call->max_reply) +
                                  " asked for");
    return UCS_OK;
  }
  bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
  if (h.answer == kAnswerOk && rndv) {
    call->reply.resize(length);
    receive_rndv(self, data, call->reply.data(), length, new ReceiveContext{self, call, {}, 0, 0});
    return UCS_INPROGRESS;
  }
  const char* bytes = static_cast<const char*>(data);
  if (h.answer == kAnswerOk) {
    call->reply.assign(bytes, bytes + length);
    call->finish(Code::ok, {});
    return UCS_OK;
  }
  std::string text = rndv ? std::string("(long error text)") : std::string(bytes, length);
  call->finish(h.answer == kAnswerRefused ? Code::refused : Code::error, call->peer + ": " + text);
  return UCS_OK;
}

void Engine::dispatch(uint64_t conn, uint64_t call, uint64_t nonce, std::vector<char> request) {
  Reply reply;
  reply.engine_ = weak_from_this();
  reply.conn_ = conn;
  reply.call_ = call;
  reply.nonce_ = nonce;
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
    nonce_ = other.nonce_;
    armed_ = other.armed_;
    other.armed_ = false;
  }
  return *this;
}

Reply::~Reply() {
  if (armed_) fail("dropped without a reply");
}

void Reply::send(std::vector<char> bytes) {
  answer(true, std::move(bytes));
}

void Reply::fail(std::string text) {
  answer(false, std::vector<char>(text.begin(), text.end()));
}

void Reply::answer(bool ok, std::vector<char> bytes) {
  if (!armed_) return;
  armed_ = false;
  std::shared_ptr<Engine> engine = engine_.lock();
  if (!engine) return;
  Engine* raw = engine.get();  // the queue runs only while the engine lives
  raw->post(
      [raw, conn = conn_, call = call_, nonce = nonce_, ok, bytes = std::move(bytes)]() mutable {
        raw->send_answer(conn, call, nonce, ok ? kAnswerOk : kAnswerError, std::move(bytes));
      });
}

Peers::Peers(std::shared_ptr<Engine> engine) : engine_(std::move(engine)) {}

std::unique_ptr<Peers> Peers::start(const std::string& bind_address, uint16_t port, std::string key,
                                    std::string identity, Handler handler, std::string& error) {
  auto engine = std::make_shared<Engine>();
  engine->key = std::move(key);
  engine->identity = std::move(identity);
  engine->handler = std::move(handler);
  if (!engine->init(bind_address, port, error)) {
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
  auto call = std::make_shared<Call>();
  call->max_reply = max_reply;
  call->deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  call->peer = host + ":" + std::to_string(port);
  call->reply = std::move(reply);
  call->reply.clear();
  reply.clear();
  {
    std::lock_guard lock(engine_->resolved_mutex);
    auto it = engine_->resolved.find(call->peer);
    if (it != engine_->resolved.end()) call->address = it->second;
  }
  if (call->address.len == 0) {
    std::string error;
    if (!resolve(host, port, false, call->address, error)) return {Code::unreachable, error};
    std::lock_guard lock(engine_->resolved_mutex);
    engine_->resolved[call->peer] = call->address;
  }
  call->request.assign(request);
  // Signed here, on the caller's thread: the progress thread only sends.
  if (getrandom(&call->nonce, sizeof call->nonce, 0) != sizeof call->nonce)
    return {Code::error, std::string("getrandom: ") + strerror(errno)};
  if (!request_mac(engine_->key, call->nonce, host, call->request, call->mac))
    return {Code::error, "HMAC-SHA256 (OpenSSL) failed"};

  Engine* engine = engine_.get();
  if (!engine->post([engine, call] { engine->start_call(call); }))
    return {Code::error, "peer transport stopped"};
  std::unique_lock lock(call->m);
  if (!call->cv.wait_until(lock, call->deadline, [&] { return call->done; })) {
    call->done = true;
    call->status = {Code::timeout,
                    "no answer from " + call->peer + " in " + std::to_string(timeout_ms) + " ms"};
  }
  if (call->status.ok()) reply = std::move(call->reply);
  return call->status;
}

}  // namespace monarch::peers
