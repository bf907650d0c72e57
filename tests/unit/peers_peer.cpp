// A peer stager for peers_test, in its own process so that the tests can
// kill -9 it, stop it, start it again and measure it. Usage: [bounded
// ANSWER_BYTES ANSWER_MS] PORT KEY [ALLOWED_ADDRESS]. Its identity is
// 127.0.0.1; with ALLOWED_ADDRESS its hosts are {127.0.0.1:
// ALLOWED_ADDRESS}: it accepts connections only from that address, of a
// caller named 127.0.0.1; with `bounded`, its Limits::answer_bytes and
// answer_ms are ANSWER_BYTES and ANSWER_MS. Prints "port N
// ADDRESS" (its worker address in hex) once listening, then serves until
// killed; its log goes to stderr. A request's first byte says what to do
// with the rest:
//   (empty request)  answers empty
//   e BYTES          answers BYTES
//   n COUNT          answers COUNT bytes, byte i being (i * 7 + 3) & 0xff
//   s MS             answers "slept" MS milliseconds later, from another thread
//   d                drops the Reply unanswered
//   x                throws from the handler
//   h                answers its Peers::held(): "ANSWERS BYTES PEAK_ANSWERS
//                    PEAK_BYTES BUSY TOO_LARGE" (its own answer not counted)
//
// Or a process speaking the wire format directly (plain sockets, UCX):
//   squat LOG         a front door without the key (prints "port N"): sends
//                     each caller a Hello, writes "proof HEAD ADDRESS" (hex)
//                     of what it got to LOG, answers a Welcome it cannot sign
//   tamper KEY        a front door with the key (prints "port N"), answers
//                     each request with an answer signed for "good" that
//                     carries "evil"
//   amnesiac KEY      a front door with the key (prints "port N") that
//                     forgets its first session without a word: its requests
//                     are never answered; those of a later session are,
//                     signed, with "again"
//   forge ADDRESS COUNT
//                     connects to the worker ADDRESS (hex) and sends it, over
//                     and over, answers "forged" for call ids 1..COUNT and
//                     sessions 1..COUNT (prints "forging" after the first)
//   replay PORT KEY   a caller with the key: sends a request "eping" to
//                     127.0.0.1:PORT, then the very same bytes again in that
//                     session, then in a new one; prints one line, what each
//                     of the three got ("ok ping", then "none": dropped unanswered)
//   spoil PORT KEY    a caller with the key and a stranger who knows its
//                     session id: see Raw::spoil; prints one line
//   hog PORT KEY COUNT SIZE
//                     a caller with the key that asks 127.0.0.1:PORT COUNT
//                     times for SIZE bytes ("nSIZE") and never takes an
//                     answer (prints "asked" once they are sent), until killed
//   relay TO          a squatter that pipes each connection to 127.0.0.1:TO
//                     (prints "port N")
//   flood PORT SECONDS [ADDRESS]
//                     a stranger without the key: prints "flooding", then for
//                     SECONDS, from 4 threads, keeps the front door at
//                     127.0.0.1:PORT busy with connections closed at once,
//                     garbage, wrong Proofs, Proofs announcing the largest
//                     address and sending none, idle connections; with the
//                     worker ADDRESS (hex, as a listener on the network learns
//                     it), also UCX messages to it: requests of sessions it
//                     guesses, eager ones of 1 MiB, rendezvous ones of 64 MiB
//   garbage PORT SECONDS churn|zeros
//                     raw TCP for SECONDS against PORT (UCX's own transport
//                     listener), from 4 threads: connections closed at once,
//                     or 64 bytes of zeros then closed; prints "flooding"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "peers.h"

using monarch::peers::Mac;
using monarch::peers::Nonce;
using monarch::peers::Options;
using monarch::peers::Peers;
using monarch::peers::Reply;
namespace wire = monarch::peers::wire;
using Clock = std::chrono::steady_clock;

namespace {

std::string hex(const void* p, size_t n) {
  std::string out;
  char two[3];
  for (size_t i = 0; i < n; ++i) {
    snprintf(two, sizeof two, "%02x", static_cast<const unsigned char*>(p)[i]);
    out += two;
  }
  return out;
}

// The address the raw clients call: 127.0.0.1, or MONARCH_PEER_ADDRESS
// (the Slurm flood test's node address).
sockaddr_in loopback(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const char* other = getenv("MONARCH_PEER_ADDRESS");
  if (other && port != 0) inet_pton(AF_INET, other, &addr.sin_addr);
  return addr;
}

std::string unhex(const std::string& text) {
  std::string out;
  for (size_t i = 0; i + 1 < text.size(); i += 2)
    out += char(std::stoi(text.substr(i, 2), nullptr, 16));
  return out;
}

int tcp_connect(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = loopback(port);
  if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

bool read_all(int fd, void* buffer, size_t length) {
  char* p = static_cast<char*>(buffer);
  while (length > 0) {
    ssize_t n = read(fd, p, length);
    if (n <= 0) return false;
    p += n;
    length -= size_t(n);
  }
  return true;
}

bool write_all(int fd, const void* buffer, size_t length) {
  return send(fd, buffer, length, MSG_NOSIGNAL) == ssize_t(length);
}

// A listening socket on the loopback (or MONARCH_PEER_ADDRESS), port printed.
int tcp_listen() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr = loopback(0);
  socklen_t n = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(fd, 64) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &n) != 0)
    return -1;
  printf("port %u\n", ntohs(addr.sin_port));
  fflush(stdout);
  return fd;
}

struct Raw {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::string address;  // our worker's

  // The worker frees the endpoints closed on it (the modes that end; the
  // others are killed).
  ~Raw() {
    if (worker) ucp_worker_destroy(worker);
    if (context) ucp_cleanup(context);
  }

  struct Message {
    unsigned id;
    std::string header, payload;
  };
  std::vector<Message> messages;  // received, small ones whole
  std::vector<ucp_ep_h> broken;
  // A caller that never takes its answers: rendezvous ones are left pending
  // (their sender holds their bytes until the endpoint goes), eager ones are
  // counted and dropped.
  bool hoard = false;
  uint64_t hoarded = 0, eager_answers = 0;

  bool init() {
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return false;
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    ucs_status_t status = ucp_init(&params, config, &context);
    ucp_config_release(config);
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (status != UCS_OK || ucp_worker_create(context, &worker_params, &worker) != UCS_OK)
      return false;
    ucp_address_t* a = nullptr;
    size_t n = 0;
    if (ucp_worker_get_address(worker, &a, &n) != UCS_OK) return false;
    address.assign(reinterpret_cast<const char*>(a), n);
    ucp_worker_release_address(worker, a);
    for (unsigned id : {wire::kRequestAm, wire::kAnswerAm}) {
      ucp_am_handler_param_t am{};
      am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
      am.id = id;
      am.cb = id == wire::kRequestAm ? on_message<wire::kRequestAm> : on_message<wire::kAnswerAm>;
      am.arg = this;
      if (ucp_worker_set_am_recv_handler(worker, &am) != UCS_OK) return false;
    }
    return true;
  }

  template <unsigned Id>
  static ucs_status_t on_message(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Raw*>(arg);
    bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    if (self->hoard && Id == wire::kAnswerAm) {
      if (!rndv && !self->eager_answers++)
        fprintf(stderr, "hog: first eager answer: %.*s\n", int(std::min<size_t>(length, 200)),
                static_cast<const char*>(data));
      if (!rndv) return UCS_OK;
      ++self->hoarded;
      return UCS_INPROGRESS;  // never received nor released
    }
    self->messages.push_back(
        {Id, std::string(static_cast<const char*>(header), header_length),
         rndv ? std::string("(rndv)") : std::string(static_cast<const char*>(data), length)});
    return UCS_OK;
  }

  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t) {
    static_cast<Raw*>(arg)->broken.push_back(ep);
  }

  ucp_ep_h connect_to(const std::string& worker_address) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = on_error;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    return ucp_ep_create(worker, &params, &ep) == UCS_OK ? ep : nullptr;
  }

  // Sends and forgets. UCX reads the header and the payload until the send
  // completes, which may be long after this returns (a send before the
  // endpoint is wired up waits for it): the header, small and often on the
  // caller's stack, is copied and freed on completion; the payload is the
  // caller's to keep (static, or held as long as the sends may run).
  static void on_sent(void* request, ucs_status_t, void* header) {
    delete[] static_cast<char*>(header);
    ucp_request_free(request);
  }
  void send(ucp_ep_h ep, unsigned id, const void* header, size_t header_length, const void* payload,
            size_t length, uint32_t flags = 0) {
    char* copy = new char[header_length];
    std::memcpy(copy, header, header_length);
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.flags = flags;
    param.cb.send = on_sent;
    param.user_data = copy;
    ucs_status_ptr_t request =
        ucp_am_send_nbx(ep, id, copy, header_length, payload, length, &param);
    if (!UCS_PTR_IS_PTR(request)) delete[] copy;
  }

  // Closes an endpoint at once (its peer may be gone; its sends fail) and
  // frees it.
  void close_ep(ucp_ep_h ep) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
    if (!UCS_PTR_IS_PTR(request)) return;
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(request);
  }

  void progress_for(int ms) {
    auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
      if (ucp_worker_progress(worker) == 0) usleep(100);
    }
  }

  // Waits for a message `id`.
  bool wait_for(unsigned id, Message& out, int ms = 3000) {
    auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
      for (size_t i = 0; i < messages.size(); ++i)
        if (messages[i].id == id) {
          out = messages[i];
          messages.erase(messages.begin() + i);
          return true;
        }
      if (ucp_worker_progress(worker) == 0) usleep(100);
    }
    return false;
  }

  // The caller's side of a handshake with the key, as peers.cpp does it.
  bool handshake(uint16_t port, const std::string& key, uint64_t& session, Nonce& nonce,
                 std::string& theirs) {
    int fd = tcp_connect(port);
    wire::Hello hello;
    char buffer[sizeof hello];
    if (fd < 0 || !read_all(fd, buffer, sizeof buffer) ||
        !wire::decode_hello(buffer, sizeof buffer, hello))
      return false;
    wire::Proof proof{wire::kMagic, uint32_t(address.size()), {9}, "raw", {}};
    wire::proof_mac(key, hello.nonce, proof.nonce, "127.0.0.1", port, "raw", address, proof.mac);
    std::string out(reinterpret_cast<char*>(&proof), sizeof proof);
    out += address;
    wire::Welcome w;
    char head[sizeof w];
    bool ok = write_all(fd, out.data(), out.size()) && read_all(fd, head, sizeof head) &&
              wire::decode_welcome_head(head, sizeof head, w);
    theirs.resize(ok ? w.address_length : 0);
    ok = ok && read_all(fd, theirs.data(), theirs.size());
    close(fd);
    session = w.session;
    nonce = hello.nonce;
    return ok;
  }

  // A front door: accepts one caller at a time, gives it a session with
  // `nonce` (signed when a key is given), and makes an endpoint to it.
  ucp_ep_h door(int listener, const std::string& key, const Nonce& nonce, FILE* log) {
    sockaddr_in own{};
    socklen_t own_length = sizeof own;
    getsockname(listener, reinterpret_cast<sockaddr*>(&own), &own_length);
    int fd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return nullptr;
    wire::Hello hello{wire::kMagic, 0, nonce};
    wire::Proof proof;
    char head[sizeof proof];
    std::string theirs;
    bool ok = write_all(fd, &hello, sizeof hello) && read_all(fd, head, sizeof head) &&
              wire::decode_proof_head(head, sizeof head, proof);
    theirs.resize(ok ? proof.address_length : 0);
    ok = ok && read_all(fd, theirs.data(), theirs.size());
    if (log && ok)
      fprintf(log, "proof %s %s\n", hex(head, sizeof head).c_str(),
              hex(theirs.data(), theirs.size()).c_str()),
          fflush(log);
    ucp_ep_h ep = ok ? connect_to(theirs) : nullptr;
    std::string_view caller;
    if (ep) {
      wire::Welcome w{wire::kMagic, uint32_t(address.size()), 77, {}};
      if (!key.empty() && wire::proof_identity(proof, caller))
        wire::welcome_mac(key, nonce, proof.nonce, "127.0.0.1", ntohs(own.sin_port), caller,
                          w.session, address, w.mac);
      std::string out(reinterpret_cast<char*>(&w), sizeof w);
      out += address;
      write_all(fd, out.data(), out.size());
    }
    close(fd);
    return ep;
  }

  // A server with a front door: answers every request through `answer`.
  template <typename Answer>
  int serve(const std::string& key, FILE* log, Answer answer) {
    int listener = tcp_listen();
    if (listener < 0) return 1;
    const Nonce nonce{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    ucp_ep_h ep = nullptr;
    for (;;) {
      if (ucp_worker_progress(worker) == 0) usleep(100);
      pollfd p{listener, POLLIN, 0};
      if (poll(&p, 1, 0) == 1) ep = door(listener, key, nonce, log);
      for (Message& m : std::exchange(messages, {})) {
        if (m.id != wire::kRequestAm || !ep) continue;
        wire::RequestHeader h{};
        if (m.header.size() >= sizeof h) memcpy(&h, m.header.data(), sizeof h);
        answer(ep, h, nonce);
      }
    }
  }

  int squat(const char* log_path) {
    FILE* log = fopen(log_path, "w");
    if (!log || !init()) return 1;
    return serve("", log, [this](ucp_ep_h ep, const wire::RequestHeader& h, const Nonce&) {
      static const char forged[] = "forged";
      wire::AnswerHeader a{wire::kMagic, wire::kAnswerOk, h.session, h.call, {}};
      send(ep, wire::kAnswerAm, &a, sizeof a, forged, 6);
    });
  }

  int tamper(const std::string& key) {
    if (!init()) return 1;
    return serve(key, nullptr,
                 [this, key](ucp_ep_h ep, const wire::RequestHeader& h, const Nonce& nonce) {
                   static const char evil[] = "evil";
                   wire::AnswerHeader a{wire::kMagic, wire::kAnswerOk, h.session, h.call, {}};
                   wire::answer_mac(key, nonce, h.seq, h.call, wire::kAnswerOk, "good", a.mac);
                   send(ep, wire::kAnswerAm, &a, sizeof a, evil, 4);
                 });
  }

  int amnesiac(const std::string& key) {
    if (!init()) return 1;
    ucp_ep_h first = nullptr;
    return serve(key, nullptr, [&](ucp_ep_h ep, const wire::RequestHeader& h, const Nonce& nonce) {
      if (!first) first = ep;
      if (ep == first) return;
      static const char again[] = "again";
      wire::AnswerHeader a{wire::kMagic, wire::kAnswerOk, h.session, h.call, {}};
      wire::answer_mac(key, nonce, h.seq, h.call, wire::kAnswerOk, again, a.mac);
      send(ep, wire::kAnswerAm, &a, sizeof a, again, 5);
    });
  }

  int forge_all(const std::string& target, uint64_t count) {
    ucp_ep_h ep = connect_to(target);
    if (!ep) return 1;
    for (bool first = true;; first = false) {
      for (uint64_t call = 1; call <= count; ++call) {
        static const char forged[] = "forged";
        wire::AnswerHeader a{wire::kMagic, wire::kAnswerOk, call, call, {}};
        send(ep, wire::kAnswerAm, &a, sizeof a, forged, 6);
      }
      if (first) {
        printf("forging\n");
        fflush(stdout);
      }
      progress_for(1);
    }
  }

  // What the answer was: "ok PAYLOAD", "error TEXT" or "none".
  std::string answer(int ms = 3000) {
    Message m;
    if (!wait_for(wire::kAnswerAm, m, ms)) return "none";
    wire::AnswerHeader a;
    if (!wire::decode_answer(m.header.data(), m.header.size(), a)) return "garbage";
    const char* code = a.answer == wire::kAnswerOk ? "ok" : "error";
    return std::string(code) + " " + m.payload;
  }

  int replay(uint16_t port, const std::string& key) {
    uint64_t session;
    Nonce nonce;
    std::string theirs;
    if (!init() || !handshake(port, key, session, nonce, theirs)) return 1;
    ucp_ep_h first = connect_to(theirs);
    if (!first) return 1;
    wire::RequestHeader h{wire::kMagic, 0, session, 7, 1, {}};
    std::string request = "eping";
    wire::request_mac(key, nonce, h.seq, h.call, "127.0.0.1", request, h.mac);
    send(first, wire::kRequestAm, &h, sizeof h, request.data(), request.size());
    std::string once = answer();
    send(first, wire::kRequestAm, &h, sizeof h, request.data(), request.size());
    std::string again = answer(1000);
    // In a new session: the captured bytes under the new session's id.
    if (!handshake(port, key, session, nonce, theirs)) return 1;
    ucp_ep_h second = connect_to(theirs);
    if (!second) return 1;
    h.session = session;
    send(second, wire::kRequestAm, &h, sizeof h, request.data(), request.size());
    std::string elsewhere = answer(1000);
    printf("%s | %s | %s\n", once.c_str(), again.c_str(), elsewhere.c_str());
    fflush(stdout);
    return 0;
  }

  // A caller with the key makes a session and is served ("eping"); a
  // stranger who learned the session id (it travels in clear) sends, from
  // its own endpoint, a request of that session with the next sequence
  // number and a MAC it cannot make; then the caller sends its next request.
  // Prints what each of the three got ("ok ping | none | ok pong").
  int spoil(uint16_t port, const std::string& key) {
    uint64_t session;
    Nonce nonce;
    std::string theirs;
    if (!init() || !handshake(port, key, session, nonce, theirs)) return 1;
    ucp_ep_h caller = connect_to(theirs);
    if (!caller) return 1;
    // UCX reads a send's header and payload until it completes: they live
    // as long as the function.
    std::list<std::pair<wire::RequestHeader, std::string>> sent;
    auto request = [&](Raw& from, ucp_ep_h ep, uint64_t seq, const std::string& text,
                       bool signed_) {
      auto& [h, payload] = sent.emplace_back(
          wire::RequestHeader{wire::kMagic, 0, session, 100 + seq, seq, {}}, text);
      if (signed_) wire::request_mac(key, nonce, seq, h.call, "127.0.0.1", payload, h.mac);
      from.send(ep, wire::kRequestAm, &h, sizeof h, payload.data(), payload.size());
    };
    request(*this, caller, 1, "eping", true);
    std::string first = answer();
    Raw stranger;
    ucp_ep_h intruder = stranger.init() ? stranger.connect_to(theirs) : nullptr;
    if (!intruder) return 1;
    request(stranger, intruder, 2, "eevil", false);
    stranger.progress_for(200);
    std::string forged = answer(1000);
    request(*this, caller, 2, "epong", true);
    std::string next = answer();
    printf("%s | %s | %s\n", first.c_str(), forged.c_str(), next.c_str());
    fflush(stdout);
    return 0;
  }

  // A caller with the key that asks `count` times for `size` bytes and never
  // takes an answer (see hoard): prints "asked", then keeps its endpoint
  // open, progressing, until killed.
  int hog(uint16_t port, const std::string& key, unsigned count, size_t size) {
    uint64_t session;
    Nonce nonce;
    std::string theirs;
    if (!init() || !handshake(port, key, session, nonce, theirs)) return 1;
    ucp_ep_h ep = connect_to(theirs);
    if (!ep) return 1;
    std::list<std::pair<wire::RequestHeader, std::string>> sent;  // alive while UCX reads them
    auto request = [&](uint64_t seq, const std::string& text) {
      auto& [h, payload] =
          sent.emplace_back(wire::RequestHeader{wire::kMagic, 0, session, seq, seq, {}}, text);
      wire::request_mac(key, nonce, seq, h.call, "127.0.0.1", payload, h.mac);
      send(ep, wire::kRequestAm, &h, sizeof h, payload.data(), payload.size());
    };
    request(1, "ewarm");  // the endpoint wired up, answered
    if (answer() != "ok warm") return 1;
    hoard = true;
    // In rounds of 32, within the server's bound on requests served at once.
    for (unsigned i = 0; i < count; ++i) {
      request(2 + i, "n" + std::to_string(size));
      if (i % 32 == 31) progress_for(600);
    }
    progress_for(500);
    printf("asked\n");
    fflush(stdout);
    for (;;) {
      progress_for(1000);
      fprintf(stderr, "hog: %llu answers left pending, %llu eager dropped\n",
              (unsigned long long)hoarded, (unsigned long long)eager_answers);
    }
  }

  // UCX messages to a worker whose address a stranger learned.
  void flood_ucx(const std::string& target, Clock::time_point until) {
    static std::vector<char> big(64 << 20, 'x'), eager(1 << 20, 'y');
    ucp_ep_h ep = connect_to(target);
    uint64_t sent = 0;
    while (ep && Clock::now() < until) {
      wire::RequestHeader h{wire::kMagic, 0, sent + 1, sent + 1, sent + 1, {}};
      ++sent;
      switch (sent % 4) {
        case 0:
          send(ep, wire::kRequestAm, &h, sizeof h, big.data(), big.size(), UCP_AM_SEND_FLAG_RNDV);
          break;
        case 1:
          send(ep, wire::kRequestAm, &h, sizeof h, eager.data(), eager.size(),
               UCP_AM_SEND_FLAG_EAGER);
          break;
        case 2: {
          static char junk[40];  // the payload, read until its send completes
          for (char& c : junk) c = char(sent * 31 + 7);
          send(ep, unsigned(sent % 4), junk, sizeof junk, junk, sizeof junk);
          break;
        }
        case 3:
          send(ep, wire::kRequestAm, &h, sizeof h, "eping", 5);
          break;
      }
      for (int i = 0; i < 100 && ucp_worker_progress(worker); ++i) {
      }
      if (!broken.empty()) {
        for (ucp_ep_h b : broken) close_ep(b);
        if (std::find(broken.begin(), broken.end(), ep) == broken.end()) close_ep(ep);
        broken.clear();
        ep = connect_to(target);
      }
      usleep(2000);
    }
    if (ep) close_ep(ep);
    fprintf(stderr, "flood: %llu UCX messages sent\n", (unsigned long long)sent);
  }
};

// Plain TCP against a port, from 4 threads, until `until`: kind 0 connects
// and closes, 1 sends 64 zero bytes and closes, 2 sends a wrong Proof, 3
// announces the largest address and sends none (kept open), 4 stays silent
// (kept open). Those kept open are closed 2 s later.
void flood_tcp(uint16_t port, Clock::time_point until, int only, std::atomic<uint64_t>& opened) {
  std::vector<std::pair<int, Clock::time_point>> held;
  for (unsigned n = 0; Clock::now() < until; ++n) {
    unsigned kind = only >= 0 ? unsigned(only) : n % 5;
    int fd = tcp_connect(port);
    if (fd < 0) {
      usleep(1000);
      continue;
    }
    ++opened;
    if (kind == 1) {
      char zeros[64] = {};
      write_all(fd, zeros, sizeof zeros);
    } else if (kind == 2 || kind == 3) {
      wire::Proof p{wire::kMagic, uint32_t(kind == 2 ? 1 : wire::kMaxAddress), {}, "x", {}};
      std::string out(reinterpret_cast<char*>(&p), sizeof p);
      if (kind == 2) out += 'a';
      write_all(fd, out.data(), out.size());
    }
    if (kind >= 3) {
      held.push_back({fd, Clock::now()});
    } else {
      close(fd);
    }
    for (size_t i = 0; i < held.size();)
      if (Clock::now() - held[i].second > std::chrono::seconds(2)) {
        close(held[i].first);
        held[i] = held.back();
        held.pop_back();
      } else {
        ++i;
      }
  }
  for (auto& [fd, when] : held) close(fd);
}

int flood(uint16_t port, int seconds, int only, const std::string& target) {
  printf("flooding\n");
  fflush(stdout);
  auto until = Clock::now() + std::chrono::seconds(seconds);
  std::atomic<uint64_t> opened{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&] { flood_tcp(port, until, only, opened); });
  if (!target.empty()) {
    Raw raw;
    if (raw.init()) raw.flood_ucx(target, until);
  }
  for (auto& t : threads) t.join();
  fprintf(stderr, "flood: %llu TCP connections opened\n", (unsigned long long)opened.load());
  return 0;
}

}  // namespace

// A squatter on another port that pipes each connection, whole, to the
// stager's front door at 127.0.0.1:TO (prints "port N"), one at a time.
int relay(uint16_t to) {
  int listener = tcp_listen();
  if (listener < 0) return 1;
  for (;;) {
    int a = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    int b = a < 0 ? -1 : tcp_connect(to);
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    char buffer[8192];
    for (bool open = b >= 0; open && poll(p, 2, 5000) > 0;)
      for (int i = 0; open && i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = read(p[i].fd, buffer, sizeof buffer);
        open = n > 0 && write_all(p[1 - i].fd, buffer, size_t(n));
      }
    if (a >= 0) close(a);
    if (b >= 0) close(b);
  }
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (argc == 6 && mode == "hog")
    return Raw().hog(std::stoi(argv[2]), argv[3], unsigned(std::stoul(argv[4])),
                     std::stoull(argv[5]));
  if (argc == 3 && mode == "relay") return relay(uint16_t(std::stoi(argv[2])));
  if (argc == 4 && mode == "spoil") return Raw().spoil(std::stoi(argv[2]), argv[3]);
  if (argc == 3 && mode == "squat") return Raw().squat(argv[2]);
  if (argc == 3 && mode == "amnesiac") return Raw().amnesiac(argv[2]);
  if (argc == 3 && mode == "tamper") return Raw().tamper(argv[2]);
  if (argc == 4 && mode == "replay") return Raw().replay(std::stoi(argv[2]), argv[3]);
  if (argc == 4 && mode == "forge") {
    Raw raw;
    return raw.init() ? raw.forge_all(unhex(argv[2]), std::stoull(argv[3])) : 1;
  }
  if ((argc == 4 || argc == 5) && mode == "flood")
    return flood(std::stoi(argv[2]), std::stoi(argv[3]), -1, argc == 5 ? unhex(argv[4]) : "");
  if (argc == 5 && mode == "garbage")
    return flood(std::stoi(argv[2]), std::stoi(argv[3]), argv[4] == std::string("churn") ? 0 : 1,
                 "");
  spdlog::set_default_logger(spdlog::stderr_logger_mt("peers_peer"));
  monarch::peers::Limits limits;
  if (argc >= 6 && mode == "bounded") {
    limits.answer_bytes = std::stoull(argv[2]);
    limits.answer_ms = unsigned(std::stoul(argv[3]));
    argc -= 3;
    argv += 3;
  }
  if (argc != 3 && argc != 4) return 2;
  Peers* self = nullptr;  // set before the first request
  auto handler = [&self](std::vector<char> request, Reply reply) {
    if (request.empty()) return reply.send({});
    std::string rest(request.begin() + 1, request.end());
    switch (request[0]) {
      case 'e':
        return reply.send({request.begin() + 1, request.end()});
      case 'n': {
        std::vector<char> bytes(std::stoull(rest));
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
        return reply.send(std::move(bytes));
      }
      case 's':
        std::thread([ms = std::stoi(rest), reply = std::move(reply)]() mutable {
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
          reply.send({'s', 'l', 'e', 'p', 't'});
        }).detach();
        return;
      case 'd':
        return;
      case 'x':
        throw std::runtime_error("handler failed");
      case 'h': {
        monarch::peers::Held h = self->held();
        std::string text = std::to_string(h.answers) + " " + std::to_string(h.bytes) + " " +
                           std::to_string(h.peak_answers) + " " + std::to_string(h.peak_bytes) +
                           " " + std::to_string(h.busy) + " " + std::to_string(h.too_large);
        return reply.send({text.begin(), text.end()});
      }
    }
    reply.fail("unknown request");
  };
  Options options{.bind_address = "127.0.0.1",
                  .port = uint16_t(std::stoi(argv[1])),
                  .key = argv[2],
                  .identity = "127.0.0.1",
                  .limits = limits};
  if (argc == 4) options.hosts = {{"127.0.0.1", argv[3]}};
  std::string error;
  auto peers = Peers::start(std::move(options), handler, error);
  self = peers.get();
  if (!peers) {
    fprintf(stderr, "peers_peer: %s\n", error.c_str());
    return 1;
  }
  std::string address = peers->worker_address();
  printf("port %u %s\n", peers->port(), hex(address.data(), address.size()).c_str());
  fflush(stdout);
  for (;;) pause();
}
