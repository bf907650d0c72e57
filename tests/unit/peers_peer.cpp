// A peer stager for peers_test, in its own process so that the tests can
// kill -9 it, stop it and start it again. Usage: PORT KEY. Its identity is
// 127.0.0.1. Prints "port N" once listening, then serves until killed. A
// request's first byte says what to do with the rest:
//   (empty request)  answers empty
//   e BYTES          answers BYTES
//   n COUNT          answers COUNT bytes, byte i being (i * 7 + 3) & 0xff
//   s MS             answers "slept" MS milliseconds later, from another thread
//   d                drops the Reply unanswered
//   x                throws from the handler
//
// Or a stranger speaking the wire format with UCX directly, without the key:
//   squat LOG         listens (prints "port N"), writes "request HEADER
//                     PAYLOAD" (hex) to LOG for each request it gets, and
//                     answers it "forged" on its connection, unsigned
//   forge PORT COUNT  connects to 127.0.0.1:PORT and sends it, over and over,
//                     answers "forged" for call ids 1..COUNT (prints
//                     "forging" after the first round)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "peers.h"

using monarch::peers::Peers;
using monarch::peers::Reply;
namespace wire = monarch::peers::wire;

namespace {

struct Raw {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  std::vector<ucp_conn_request_h> incoming;
  struct Request {
    ucp_ep_h ep;
    uint64_t call;
  };
  std::vector<Request> requests;
  FILE* log = nullptr;

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
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = wire::kRequestAm;
    am.cb = on_request;
    am.arg = this;
    return ucp_worker_set_am_recv_handler(worker, &am) == UCS_OK;
  }

  static std::string hex(const void* p, size_t n) {
    std::string out;
    char two[3];
    for (size_t i = 0; i < n; ++i) {
      snprintf(two, sizeof two, "%02x", static_cast<const unsigned char*>(p)[i]);
      out += two;
    }
    return out;
  }

  static ucs_status_t on_request(void* arg, const void* header, size_t header_length, void* data,
                                 size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Raw*>(arg);
    bool rndv = param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV;
    fprintf(self->log, "request %s %s\n", hex(header, header_length).c_str(),
            rndv ? "rndv" : hex(data, length).c_str());
    fflush(self->log);
    wire::RequestHeader h{};
    if (header_length >= sizeof h) memcpy(&h, header, sizeof h);
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
      self->requests.push_back({param->reply_ep, h.call});
    return UCS_OK;
  }

  static void on_error(void*, ucp_ep_h, ucs_status_t) {}

  ucp_ep_h connect(ucp_ep_params_t params) {
    params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = on_error;
    ucp_ep_h ep = nullptr;
    return ucp_ep_create(worker, &params, &ep) == UCS_OK ? ep : nullptr;
  }

  // An answer as a stager would send it, but signed with nothing.
  void forge(ucp_ep_h ep, uint64_t call) {
    wire::AnswerHeader h{wire::kMagic, wire::kAnswerOk, call, {}};
    static const char forged[] = "forged";
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t request =
        ucp_am_send_nbx(ep, wire::kAnswerAm, &h, sizeof h, forged, 6, &param);
    if (!UCS_PTR_IS_PTR(request)) return;
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(request);
  }

  static void on_conn_request(ucp_conn_request_h request, void* arg) {
    static_cast<Raw*>(arg)->incoming.push_back(request);
  }

  int squat(const char* log_path) {
    log = fopen(log_path, "w");
    if (!log || !init()) return 1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    params.sockaddr.addrlen = sizeof addr;
    params.conn_handler.cb = on_conn_request;
    params.conn_handler.arg = this;
    ucp_listener_h listener;
    if (ucp_listener_create(worker, &params, &listener) != UCS_OK) return 1;
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucp_listener_query(listener, &attr) != UCS_OK) return 1;
    printf("port %u\n", ntohs(reinterpret_cast<sockaddr_in*>(&attr.sockaddr)->sin_port));
    fflush(stdout);
    for (;;) {
      ucp_worker_progress(worker);
      for (ucp_conn_request_h request : std::exchange(incoming, {})) {
        ucp_ep_params_t ep{};
        ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
        ep.conn_request = request;
        connect(ep);
      }
      for (Request request : std::exchange(requests, {})) forge(request.ep, request.call);
      usleep(100);
    }
  }

  int forge_all(uint16_t port, uint64_t count) {
    if (!init()) return 1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    params.sockaddr.addrlen = sizeof addr;
    ucp_ep_h ep = connect(params);
    if (!ep) return 1;
    for (bool first = true;; first = false) {
      for (uint64_t call = 1; call <= count; ++call) forge(ep, call);
      if (first) {
        printf("forging\n");
        fflush(stdout);
      }
      for (int i = 0; i < 10; ++i) ucp_worker_progress(worker);
      usleep(1000);
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "squat") return Raw().squat(argv[2]);
  if (argc == 4 && std::string(argv[1]) == "forge")
    return Raw().forge_all(std::stoi(argv[2]), std::stoull(argv[3]));
  if (argc != 3) return 2;
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
  std::string error;
  auto peers = Peers::start("127.0.0.1", std::stoi(argv[1]), argv[2], "127.0.0.1", handler, error);
  if (!peers) {
    fprintf(stderr, "peers_peer: %s\n", error.c_str());
    return 1;
  }
  printf("port %u\n", peers->port());
  fflush(stdout);
  for (;;) pause();
}
