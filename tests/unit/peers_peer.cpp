// A peer stager for peers_test, in its own process so that the tests can
// kill -9 it, stop it, start it again and measure it. Usage: PORT KEY
// [ALLOWED_ADDRESS]. Its identity is 127.0.0.1; with ALLOWED_ADDRESS it
// accepts connections only from that address. Prints "port N" once
// listening, then serves until killed. A request's first byte says what to do
// with the rest:
//   (empty request)  answers empty
//   e BYTES          answers BYTES
//   n COUNT          answers COUNT bytes, byte i being (i * 7 + 3) & 0xff
//   s MS             answers "slept" MS milliseconds later, from another thread
//   d                drops the Reply unanswered
//   x                throws from the handler
//
// Or a process speaking the wire format with UCX directly (TOKEN: the job's
// connection token, in hex, as a squatter learns it; without it, none):
//   squat LOG         listens (prints "port N"), sends each caller a
//                     challenge, writes "token HEX" for each connection and
//                     "request HEADER PAYLOAD" (hex) for each request to LOG,
//                     and answers it "forged" on its connection, unsigned
//   tamper KEY        listens (prints "port N"), answers each request with
//                     an answer signed for "good" that carries "evil"
//   forge PORT COUNT [TOKEN]
//                     connects to 127.0.0.1:PORT and sends it, over and over,
//                     answers "forged" for call ids 1..COUNT (prints
//                     "forging" after the first round)
//   replay PORT KEY   a caller with the key: sends a request "eping" to
//                     127.0.0.1:PORT, then the very same bytes again on that
//                     connection, then on a new one; prints one line, what
//                     each of the three got ("ok ping", "refused ...",
//                     "closed", "none")
//   flood PORT SECONDS [TOKEN]
//                     a stranger without the key: prints "flooding", then for
//                     SECONDS keeps 64 connections to 127.0.0.1:PORT busy
//                     with rendezvous requests of 64 MiB, eager ones of
//                     1 MiB, garbage, requests with a wrong MAC, or nothing,
//                     each connection opened again 100 ms after it closed
#include <arpa/inet.h>
#include <netinet/in.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

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

struct Raw {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  bool has_token = false;
  std::vector<ucp_conn_request_h> incoming;
  struct Message {
    unsigned id;
    ucp_ep_h ep;
    std::string header, payload;
  };
  std::vector<Message> messages;  // received, small ones whole
  std::vector<ucp_ep_h> broken;
  FILE* log = nullptr;

  bool init(uint64_t token = 0, bool with_token = false) {
    has_token = with_token;
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return false;
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM;
    ucs_status_t status = ucp_init(&params, config, &context);
    ucp_config_release(config);
    ucp_worker_params_t worker_params{};
    worker_params.field_mask =
        UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_CLIENT_ID;
    worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
    worker_params.client_id = token;
    if (status != UCS_OK || ucp_worker_create(context, &worker_params, &worker) != UCS_OK)
      return false;
    for (unsigned id : {wire::kRequestAm, wire::kAnswerAm, wire::kChallengeAm}) {
      ucp_am_handler_param_t am{};
      am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG;
      am.id = id;
      am.cb = id == wire::kRequestAm  ? on_message<wire::kRequestAm>
              : id == wire::kAnswerAm ? on_message<wire::kAnswerAm>
                                      : on_message<wire::kChallengeAm>;
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
    ucp_ep_h ep = param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP ? param->reply_ep : nullptr;
    self->messages.push_back(
        {Id, ep, std::string(static_cast<const char*>(header), header_length),
         rndv ? std::string("(rndv)") : std::string(static_cast<const char*>(data), length)});
    return UCS_OK;
  }

  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t) {
    static_cast<Raw*>(arg)->broken.push_back(ep);
  }

  ucp_ep_h connect_to(uint16_t port) {
    sockaddr_in addr = loopback(port);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags =
        UCP_EP_PARAMS_FLAGS_CLIENT_SERVER | (has_token ? UCP_EP_PARAMS_FLAGS_SEND_CLIENT_ID : 0);
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    params.sockaddr.addrlen = sizeof addr;
    return endpoint(params);
  }

  ucp_ep_h endpoint(ucp_ep_params_t params) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = on_error;
    params.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    return ucp_ep_create(worker, &params, &ep) == UCS_OK ? ep : nullptr;
  }

  // Sends and forgets (UCX frees the request once done). flags: eager,
  // rendezvous, reply.
  void send(ucp_ep_h ep, unsigned id, const void* header, size_t header_length, const void* payload,
            size_t length, uint32_t flags) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = flags;
    ucs_status_ptr_t request =
        ucp_am_send_nbx(ep, id, header, header_length, payload, length, &param);
    if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
  }

  void progress_for(int ms) {
    auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
      if (ucp_worker_progress(worker) == 0) usleep(100);
    }
  }

  // Waits for a message `id` on `ep`, or the endpoint broken.
  bool wait_for(unsigned id, ucp_ep_h ep, Message& out, int ms = 3000) {
    auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until) {
      for (size_t i = 0; i < messages.size(); ++i)
        if (messages[i].id == id && messages[i].ep == ep) {
          out = messages[i];
          messages.erase(messages.begin() + i);
          return true;
        }
      for (ucp_ep_h b : broken)
        if (b == ep) return false;
      if (ucp_worker_progress(worker) == 0) usleep(100);
    }
    return false;
  }

  static void on_conn_request(ucp_conn_request_h request, void* arg) {
    static_cast<Raw*>(arg)->incoming.push_back(request);
  }

  uint16_t listen() {
    sockaddr_in addr = loopback(0);
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    params.sockaddr.addrlen = sizeof addr;
    params.conn_handler.cb = on_conn_request;
    params.conn_handler.arg = this;
    if (ucp_listener_create(worker, &params, &listener) != UCS_OK) return 0;
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(listener, &attr) != UCS_OK) return 0;
    return ntohs(reinterpret_cast<sockaddr_in*>(&attr.sockaddr)->sin_port);
  }

  // A server without the job's key, or with it (tamper): accepts, sends a
  // challenge, answers every request through `answer`.
  template <typename Answer>
  int serve(Answer answer) {
    uint16_t port = listen();
    if (!port) return 1;
    printf("port %u\n", port);
    fflush(stdout);
    const Nonce nonce{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    for (;;) {
      if (ucp_worker_progress(worker) == 0) usleep(100);
      for (ucp_conn_request_h request : std::exchange(incoming, {})) {
        ucp_conn_request_attr_t attr{};
        attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ID;
        ucp_conn_request_query(request, &attr);
        if (log) fprintf(log, "token %016llx\n", (unsigned long long)attr.client_id), fflush(log);
        ucp_ep_params_t ep{};
        ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
        ep.conn_request = request;
        ucp_ep_h accepted = endpoint(ep);
        wire::Challenge c{wire::kMagic, 0, nonce};
        if (accepted)
          send(accepted, wire::kChallengeAm, &c, sizeof c, nullptr, 0, UCP_AM_SEND_FLAG_REPLY);
      }
      for (Message& m : std::exchange(messages, {})) {
        if (m.id != wire::kRequestAm || !m.ep) continue;
        if (log)
          fprintf(log, "request %s %s\n", hex(m.header.data(), m.header.size()).c_str(),
                  hex(m.payload.data(), m.payload.size()).c_str()),
              fflush(log);
        wire::RequestHeader h{};
        if (m.header.size() >= sizeof h) memcpy(&h, m.header.data(), sizeof h);
        answer(m.ep, h, nonce);
      }
    }
  }

  int squat(const char* log_path) {
    log = fopen(log_path, "w");
    if (!log || !init()) return 1;
    return serve([this](ucp_ep_h ep, const wire::RequestHeader& h, const Nonce&) {
      static const char forged[] = "forged";
      wire::AnswerHeader a{wire::kMagic, wire::kAnswerOk, h.call, {}};
      send(ep, wire::kAnswerAm, &a, sizeof a, forged, 6, UCP_AM_SEND_FLAG_REPLY);
    });
  }

  int tamper(const std::string& key) {
    if (!init()) return 1;
    return serve([this, key](ucp_ep_h ep, const wire::RequestHeader& h, const Nonce& nonce) {
      static const char evil[] = "evil";
      wire::AnswerHeader a{wire::kMagic, wire::kAnswerOk, h.call, {}};
      wire::answer_mac(key, nonce, h.seq, h.call, wire::kAnswerOk, "good", a.mac);
      send(ep, wire::kAnswerAm, &a, sizeof a, evil, 4, UCP_AM_SEND_FLAG_REPLY);
    });
  }

  int forge_all(uint16_t port, uint64_t count) {
    ucp_ep_h ep = connect_to(port);
    if (!ep) return 1;
    for (bool first = true;; first = false) {
      for (uint64_t call = 1; call <= count; ++call) {
        static const char forged[] = "forged";
        wire::AnswerHeader a{wire::kMagic, wire::kAnswerOk, call, {}};
        send(ep, wire::kAnswerAm, &a, sizeof a, forged, 6, UCP_AM_SEND_FLAG_REPLY);
      }
      if (first) {
        printf("forging\n");
        fflush(stdout);
      }
      progress_for(1);
    }
  }

  // What an answer to `call` on `ep` was: "ok PAYLOAD", "refused TEXT",
  // "error TEXT", "closed" (the connection broke first) or "none".
  std::string answer_to(ucp_ep_h ep) {
    Message m;
    if (!wait_for(wire::kAnswerAm, ep, m)) {
      for (ucp_ep_h b : broken)
        if (b == ep) return "closed";
      return "none";
    }
    wire::AnswerHeader a;
    if (!wire::decode_answer(m.header.data(), m.header.size(), a)) return "garbage";
    const char* code = a.answer == wire::kAnswerOk        ? "ok"
                       : a.answer == wire::kAnswerRefused ? "refused"
                                                          : "error";
    return std::string(code) + " " + m.payload;
  }

  int replay(uint16_t port, const std::string& key) {
    if (!init(wire::connect_token(key), true)) return 1;
    ucp_ep_h first = connect_to(port);
    Message challenge;
    if (!first || !wait_for(wire::kChallengeAm, first, challenge)) return 1;
    wire::Challenge c;
    if (!wire::decode_challenge(challenge.header.data(), challenge.header.size(), 0, c)) return 1;
    wire::RequestHeader h{wire::kMagic, 0, 7, 1, {}};
    std::string request = "eping";
    wire::request_mac(key, c.nonce, h.seq, h.call, "127.0.0.1", request, h.mac);
    send(first, wire::kRequestAm, &h, sizeof h, request.data(), request.size(),
         UCP_AM_SEND_FLAG_REPLY);
    std::string once = answer_to(first);
    send(first, wire::kRequestAm, &h, sizeof h, request.data(), request.size(),
         UCP_AM_SEND_FLAG_REPLY);
    std::string again = answer_to(first);
    ucp_ep_h second = connect_to(port);
    if (!second || !wait_for(wire::kChallengeAm, second, challenge)) return 1;
    send(second, wire::kRequestAm, &h, sizeof h, request.data(), request.size(),
         UCP_AM_SEND_FLAG_REPLY);
    std::string elsewhere = answer_to(second);
    printf("%s | %s | %s\n", once.c_str(), again.c_str(), elsewhere.c_str());
    fflush(stdout);
    return 0;
  }

  int flood(uint16_t port, int seconds) {
    constexpr size_t kConnections = 64;
    // Faster churn crashes UCX 1.13's connection manager by itself (a stale
    // event on a reused descriptor: openucx/ucx#11458), whatever the server.
    constexpr int kReconnectMs = 100;
    static std::vector<char> big(64 << 20, 'x'), eager(1 << 20, 'y');
    struct Slot {
      ucp_ep_h ep = nullptr;
      unsigned kind = 0;
      Clock::time_point next;
    };
    std::vector<Slot> slots(kConnections);
    for (size_t i = 0; i < slots.size(); ++i) slots[i].kind = unsigned(i % 5);
    printf("flooding\n");
    fflush(stdout);
    uint64_t opened = 0, sent = 0;
    auto until = Clock::now() + std::chrono::seconds(seconds);
    while (Clock::now() < until) {
      for (ucp_ep_h ep : std::exchange(broken, {}))
        for (Slot& s : slots)
          if (s.ep == ep) {
            ucp_request_param_t param{};
            param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
            param.flags = UCP_EP_CLOSE_FLAG_FORCE;
            ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
            if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
            s.ep = nullptr;
            s.next = Clock::now() + std::chrono::milliseconds(kReconnectMs);
          }
      messages.clear();
      auto now = Clock::now();
      for (Slot& s : slots) {
        if (!s.ep) {
          if (now < s.next) continue;
          s.ep = connect_to(port);
          s.next = now + std::chrono::milliseconds(5);
          ++opened;
          continue;
        }
        if (now < s.next) continue;
        s.next = now + std::chrono::milliseconds(50);
        wire::RequestHeader h{wire::kMagic, 0, sent + 1, sent + 1, {}};
        ++sent;
        switch (s.kind) {
          case 0:  // idle
            break;
          case 1:  // a large request by rendezvous
            send(s.ep, wire::kRequestAm, &h, sizeof h, big.data(), big.size(),
                 UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY);
            break;
          case 2:  // a large request, eager
            send(s.ep, wire::kRequestAm, &h, sizeof h, eager.data(), eager.size(),
                 UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
            break;
          case 3: {  // garbage
            char junk[40];
            for (char& c : junk) c = char(sent * 31 + 7);
            send(s.ep, unsigned(sent % 4), junk, sizeof junk, junk, sizeof junk,
                 UCP_AM_SEND_FLAG_REPLY);
            break;
          }
          case 4:  // a well-formed request with a wrong MAC
            send(s.ep, wire::kRequestAm, &h, sizeof h, "eping", 5, UCP_AM_SEND_FLAG_REPLY);
            break;
        }
      }
      for (int i = 0; i < 100 && ucp_worker_progress(worker); ++i) {
      }
      usleep(200);
    }
    fprintf(stderr, "flood: %llu connections opened, %llu messages sent\n",
            (unsigned long long)opened, (unsigned long long)sent);
    return 0;
  }
};

uint64_t token_of(int argc, char** argv, int at, bool& given) {
  given = argc > at;
  return given ? std::stoull(argv[at], nullptr, 16) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  bool given = false;
  if (argc == 3 && mode == "squat") return Raw().squat(argv[2]);
  if (argc == 3 && mode == "tamper") return Raw().tamper(argv[2]);
  if (argc == 4 && mode == "replay") return Raw().replay(std::stoi(argv[2]), argv[3]);
  if ((argc == 4 || argc == 5) && mode == "forge") {
    Raw raw;
    uint64_t token = token_of(argc, argv, 4, given);
    return raw.init(token, given) ? raw.forge_all(std::stoi(argv[2]), std::stoull(argv[3])) : 1;
  }
  if ((argc == 4 || argc == 5) && mode == "flood") {
    Raw raw;
    uint64_t token = token_of(argc, argv, 4, given);
    return raw.init(token, given) ? raw.flood(std::stoi(argv[2]), std::stoi(argv[3])) : 1;
  }
  if (argc != 3 && argc != 4) return 2;
  auto handler = [](std::vector<char> request, Reply reply) {
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
    }
    reply.fail("unknown request");
  };
  Options options{.bind_address = "127.0.0.1",
                  .port = uint16_t(std::stoi(argv[1])),
                  .key = argv[2],
                  .identity = "127.0.0.1"};
  if (argc == 4) options.hosts = {{"allowed", argv[3]}};
  std::string error;
  auto peers = Peers::start(std::move(options), handler, error);
  if (!peers) {
    fprintf(stderr, "peers_peer: %s\n", error.c_str());
    return 1;
  }
  printf("port %u\n", peers->port());
  fflush(stdout);
  for (;;) pause();
}
