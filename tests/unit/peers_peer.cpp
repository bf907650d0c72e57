// A peer stager for peers_test, in its own process so that the tests can
// kill -9 it, stop it and start it again. Usage: PORT KEY. Prints
// "port N" once listening, then serves until killed. A request's first
// byte says what to do with the rest:
//   (empty request)  answers empty
//   e BYTES          answers BYTES
//   n COUNT          answers COUNT bytes, byte i being (i * 7 + 3) & 0xff
//   s MS             answers "slept" MS milliseconds later, from another thread
//   d                drops the Reply unanswered
//   x                throws from the handler
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

#include "peers.h"

using monarch::peers::Peers;
using monarch::peers::Reply;

int main(int argc, char** argv) {
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
  auto peers = Peers::start("127.0.0.1", std::stoi(argv[1]), argv[2], handler, error);
  if (!peers) {
    fprintf(stderr, "peers_peer: %s\n", error.c_str());
    return 1;
  }
  printf("port %u\n", peers->port());
  fflush(stdout);
  for (;;) pause();
}
