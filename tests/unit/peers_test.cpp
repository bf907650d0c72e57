// The peer transport over real UCX (TCP on the loopback), against a peer in
// another process (peers_peer.cpp) that the tests kill, stop and restart.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <mutex>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "peers.h"

extern char** environ;

#include "largest_allocation.h"
#include "sanitized.h"

namespace monarch::peers {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kKey = "job-1234-secret";

long ms_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// TCP only, on the loopback: the path a cluster's network takes, not shared
// memory. Set before UCX reads its environment, here and in the peers.
const bool tcp_only = [] {
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  return true;
}();

// The peer process: started with a port (0: any), knows its port. Or a
// stranger (peers_peer.cpp: squat, forge), known by its first line.
struct Peer {
  pid_t pid = -1;
  uint16_t port = 0;
  std::string line;     // the first it printed
  std::string address;  // its worker address, in hex, when it printed one

  static Peer start(uint16_t port) { return run({std::to_string(port), kKey}); }
  static Peer run(std::vector<std::string> args) {
    Peer peer;
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) return peer;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    std::vector<char*> argv{const_cast<char*>(MONARCH_PEERS_PEER)};
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    if (posix_spawn(&peer.pid, MONARCH_PEERS_PEER, &actions, nullptr, argv.data(), environ) != 0)
      peer.pid = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    pollfd p{out[0], POLLIN, 0};
    char line[16384] = {};
    if (peer.pid > 0 && poll(&p, 1, 5000) == 1 && read(out[0], line, sizeof line - 1) > 0) {
      peer.line = line;
      std::istringstream words(peer.line);
      std::string word;
      words >> word;
      if (word == "port") words >> peer.port >> peer.address;
    }
    close(out[0]);
    return peer;
  }
  void signal(int sig) const { kill(pid, sig); }
  // SIGSTOP, returning once the kernel has stopped every thread of the peer
  // (kill() returns before: a request sent at once could still be answered).
  bool pause() const {
    int status = 0;
    return kill(pid, SIGSTOP) == 0 && waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status);
  }
  void stop() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

struct PeersTest : ::testing::Test {
  static void SetUpTestSuite() { shared = Peer::start(0); }
  static void TearDownTestSuite() { shared.stop(); }
  void SetUp() override {
    ASSERT_NE(shared.port, 0) << "the peer process did not start";
    client = start_client(kKey);
    ASSERT_TRUE(client);
  }
  static std::unique_ptr<Peers> start_client(const std::string& key,
                                             const std::string& address = "127.0.0.1") {
    std::string error;
    auto peers = Peers::start(
        {.bind_address = address, .key = key, .identity = address},
        [](std::vector<char>, Reply reply) { reply.fail("client only"); }, error);
    EXPECT_TRUE(peers) << error;
    return peers;
  }
  Status call(uint16_t port, const std::string& request, std::vector<char>& reply,
              int timeout_ms = 5000, size_t max_reply = kMaxAnswer) {
    return client->call("127.0.0.1", port, request, reply, timeout_ms, max_reply);
  }
  static Peer shared;
  std::unique_ptr<Peers> client;
};
Peer PeersTest::shared;

std::string pattern(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed) >> 3);
  return s;
}

// Requests are short (at most wire::kMaxRequest bytes: a longer one is an
// error, never sent); answers of any size up to a piece (4 MiB) arrive whole.
TEST_F(PeersTest, RoundTripsKeepEveryByteWhateverTheSize) {
  std::vector<char> reply;
  ASSERT_TRUE(call(shared.port, "", reply).ok());
  EXPECT_TRUE(reply.empty());
  for (size_t size : {size_t{0}, size_t{1}, wire::kMaxRequest - 1}) {
    std::string payload = pattern(size, unsigned(size));
    Status status = call(shared.port, "e" + payload, reply);
    ASSERT_TRUE(status.ok()) << size << ": " << status.text;
    ASSERT_EQ(reply.size(), size);
    EXPECT_TRUE(std::equal(reply.begin(), reply.end(), payload.begin())) << size;
  }
  Status status = call(shared.port, "e" + pattern(wire::kMaxRequest, 1), reply);
  EXPECT_EQ(status.code, Code::error) << status.text;
  for (size_t size : {size_t{64} << 10, size_t{1} << 20, size_t{4} << 20}) {
    status = call(shared.port, "n" + std::to_string(size), reply);
    ASSERT_TRUE(status.ok()) << size << ": " << status.text;
    ASSERT_EQ(reply.size(), size);
    for (size_t i = 0; i < size; i += 4093) ASSERT_EQ(reply[i], static_cast<char>(i * 7 + 3));
  }
}

// The file-read case: a short request, a piece of 4 MiB in answer, received
// into the caller's reused buffer. Prints the throughput.
TEST_F(PeersTest, LongAnswersArriveWholeAndFast) {
  const size_t size = 4 << 20;
  const int rounds = 64;
  std::vector<char> reply;
  ASSERT_TRUE(call(shared.port, "n" + std::to_string(size), reply).ok());  // connected, warm
  auto t0 = Clock::now();
  for (int i = 0; i < rounds; ++i) {
    Status status = call(shared.port, "n" + std::to_string(size), reply);
    ASSERT_TRUE(status.ok()) << status.text;
    ASSERT_EQ(reply.size(), size);
  }
  double seconds = ms_since(t0) / 1000.0;
  for (size_t i = 0; i < size; ++i)
    ASSERT_EQ(reply[i], static_cast<char>(i * 7 + 3)) << "byte " << i;
  printf("[ throughput ] %d x 4 MiB answers: %.0f MB/s\n", rounds,
         rounds * size / 1e6 / std::max(seconds, 1e-3));
}

TEST_F(PeersTest, EightThreadsCallAtOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (unsigned t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<char> reply;
      for (unsigned i = 0; i < 40; ++i) {
        std::string payload = pattern((t * 40 + i) * 997 % wire::kMaxRequest, t * 100 + i);
        size_t size = (t * 40 + i) * 7919 % (300 << 10);
        Status status = call(shared.port, "e" + payload, reply);
        bool echoed = status.ok() && reply.size() == payload.size() &&
                      std::equal(reply.begin(), reply.end(), payload.begin());
        status = call(shared.port, "n" + std::to_string(size), reply);
        if (echoed && status.ok() && reply.size() == size &&
            (size == 0 || reply[size - 1] == static_cast<char>((size - 1) * 7 + 3)))
          ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good, 8 * 40);
}

// A caller with another key gets no Welcome: the front door closes, which
// the caller cannot tell from a handshake a flood evicted (`unreachable`).
TEST_F(PeersTest, AnotherKeyIsNeverServed) {
  auto stranger = start_client("another-job");
  std::vector<char> reply;
  Status status = stranger->call("127.0.0.1", shared.port, "e1", reply, 5000, 1024);
  EXPECT_EQ(status.code, Code::unreachable) << status.text;
  EXPECT_NE(status.text.find("closed the connection before its welcome"), std::string::npos)
      << status.text;
  EXPECT_TRUE(reply.empty());
  status = stranger->call("127.0.0.1", shared.port, "e2", reply, 5000, 1024);
  EXPECT_NE(status.code, Code::ok) << "a stranger must never be answered";
  auto empty_key = start_client("");
  EXPECT_EQ(empty_key->call("127.0.0.1", shared.port, "e3", reply, 5000, 1024).code,
            Code::unreachable);
  // The job's own stagers are still served.
  ASSERT_TRUE(call(shared.port, "eok", reply).ok());
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "ok");
}

// A Proof for another name than the server's identity is not taken, though
// the key is right: no session.
TEST_F(PeersTest, RequestForAnotherStagerIsNotServed) {
  std::vector<char> reply;
  // "127.1" is 127.0.0.1 too, to the resolver, but not the peer's name: its
  // front door does not take the caller's proof.
  Status status = client->call("127.1", shared.port, "eother", reply, 5000, 1024);
  EXPECT_EQ(status.code, Code::unreachable) << status.text;
  EXPECT_NE(status.text.find("closed the connection before its welcome"), std::string::npos)
      << status.text;
  EXPECT_TRUE(reply.empty());
  ASSERT_TRUE(call(shared.port, "eme", reply).ok());
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "me");
}

std::string hex(std::string_view bytes) {
  std::string out;
  char two[3];
  for (unsigned char c : bytes) {
    snprintf(two, sizeof two, "%02x", c);
    out += two;
  }
  return out;
}

// A process that took the job's port before the stager (a squatter) gets a
// proof of the key, but not the key; the Welcome it makes up is not taken,
// nor is anything sent to it over UCX.
TEST_F(PeersTest, TheKeyNeverTravelsAndAStrangersAnswerIsNotTaken) {
  std::string log = ::testing::TempDir() + "peers_squat.log";
  Peer squatter = Peer::run({"squat", log});
  ASSERT_NE(squatter.port, 0) << "the squatter did not start";
  std::vector<char> reply;
  Status status = call(squatter.port, "eplease", reply, 2000);
  EXPECT_EQ(status.code, Code::refused) << status.text;
  EXPECT_NE(status.text.find("welcome not signed"), std::string::npos) << status.text;
  EXPECT_TRUE(reply.empty()) << "the squatter's bytes were taken";
  squatter.stop();

  std::ifstream in(log);
  std::stringstream seen;
  seen << in.rdbuf();
  std::string lines = seen.str();
  // What it got: one Proof, fixed part and worker address as they travelled.
  std::string word, head, address;
  std::istringstream(lines) >> word >> head >> address;
  EXPECT_EQ(word, "proof") << lines;
  EXPECT_EQ(head.size(), 2 * sizeof(wire::Proof)) << lines;
  EXPECT_EQ(address, hex(client->worker_address())) << lines;
  EXPECT_EQ(lines.find(hex(kKey)), std::string::npos) << "the key travelled: " << lines;
}

// The review's reproduction, against a stranger that knows this stager's
// worker address (it travels in clear): while this stager waits on a slow
// peer, the stranger sends it answers for call ids and sessions 1..300. Not
// one is taken (call ids are random); every call times out.
TEST_F(PeersTest, ForgedAnswersOnAnotherConnectionAreNotTaken) {
  Peer forger = Peer::run({"forge", hex(client->worker_address()), "300"});
  ASSERT_EQ(forger.line, "forging\n") << "the forger did not start";
  int forged = 0, timeouts = 0;
  for (int i = 0; i < 20; ++i) {
    std::vector<char> reply;
    Status status = call(shared.port, "s1000", reply, 200);
    if (std::string(reply.begin(), reply.end()) == "forged" || status.ok()) ++forged;
    if (status.code == Code::timeout) ++timeouts;
  }
  forger.stop();
  EXPECT_EQ(forged, 0);
  EXPECT_EQ(timeouts, 20);
  std::vector<char> reply;
  ASSERT_TRUE(call(shared.port, "estill", reply).ok());
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "still");
}

// A request captured as it travelled and sent again, byte for byte, on its
// session or in another, is dropped unanswered (the sequence window; the
// other session's nonce); the first one was served.
TEST_F(PeersTest, AReplayedRequestIsDroppedUnanswered) {
  Peer replayer = Peer::run({"replay", std::to_string(shared.port), kKey});
  std::string line = replayer.line;
  replayer.stop();
  EXPECT_EQ(line, "ok ping | none | none\n");
  std::vector<char> reply;
  ASSERT_TRUE(call(shared.port, "estill", reply).ok());
}

// The review's finding: a stranger who knows a live session id (it travels
// in clear) sends a request of it that it cannot sign. It is dropped
// unanswered (no verdict signed for the stranger's call), and the session
// stays: the caller's next request, with the very sequence number the
// stranger used, is served.
TEST_F(PeersTest, AnUnsignedRequestOfALiveSessionLeavesItServing) {
  Peer spoiler = Peer::run({"spoil", std::to_string(shared.port), kKey});
  std::string line = spoiler.line;
  spoiler.stop();
  EXPECT_EQ(line, "ok ping | none | ok pong\n");
}

// A squatter on another port (another of the job's candidates) relays a
// caller's handshake to the stager's front door: the Proof covers the port
// the caller dialed, not the stager's, so no session is made for the relay
// to learn; the stager serves the caller that dials it.
TEST_F(PeersTest, AHandshakeRelayedFromAnotherPortFails) {
  Peer relay = Peer::run({"relay", std::to_string(shared.port)});
  ASSERT_NE(relay.port, 0) << "the relay did not start";
  std::vector<char> reply;
  Status status = call(relay.port, "erelayed", reply, 3000);
  relay.stop();
  EXPECT_EQ(status.code, Code::unreachable) << status.text;
  EXPECT_TRUE(reply.empty());
  ASSERT_TRUE(call(shared.port, "edirect", reply).ok());
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "direct");
}

// A server that forgets a session without a word (a stager's sessions per
// address are bounded; the oldest goes) and whose endpoint stays up: the
// caller's call on it times out with nothing heard, the caller forgets the
// session, and its next call handshakes again and is served. (Keeping the
// session, every later call would time out too.)
TEST_F(PeersTest, ACallAfterASilentTimeoutHandshakesAgain) {
  Peer amnesiac = Peer::run({"amnesiac", kKey});
  ASSERT_NE(amnesiac.port, 0) << "the server did not start";
  std::vector<char> reply;
  // Longer than Limits::silent_session_ms: the session was silent that long.
  Status status = call(amnesiac.port, "eforgotten", reply, 1500);
  EXPECT_EQ(status.code, Code::timeout) << status.text;
  status = call(amnesiac.port, "eagain", reply, 5000);
  amnesiac.stop();
  ASSERT_TRUE(status.ok()) << status.text;
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "again");
}

// Newer sessions from the caller's address replace its oldest at the
// server (authenticated_per_source): the caller's next calls are served by
// a new session (UCX may report the server's endpoint closed, or the call
// times out with nothing heard).
TEST_F(PeersTest, ASessionReplacedByNewerOnesIsMadeAgain) {
  Peer server = Peer::start(0);
  ASSERT_NE(server.port, 0);
  std::vector<char> reply;
  ASSERT_TRUE(call(server.port, "efirst", reply).ok());
  for (unsigned i = 0; i <= Limits{}.authenticated_per_source; ++i) {
    auto other = start_client(kKey);
    ASSERT_TRUE(other->call("127.0.0.1", server.port, "e", reply, 5000, 1024).ok());
  }
  // UCX may report the server's endpoint closed first (then the caller
  // forgets the session on that): this call fails or is served by a new one.
  Status status = call(server.port, "elost", reply, 1000);
  printf("[ evicted session ] the next call: %s %s\n", to_string(status.code), status.text.c_str());
  status = call(server.port, "eagain", reply, 5000);
  server.stop();
  ASSERT_TRUE(status.ok()) << status.text;
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "again");
}

// A churn of connections from the caller's own address (closed at once,
// garbage, stalled Proofs, idle ones) evicts handshakes, the caller's among
// them: those are `unreachable` or `timeout`, never `refused` (which the job
// takes as final), and most succeed.
TEST_F(PeersTest, AChurnFromTheCallersAddressNeverMakesAHandshakeRefused) {
  Peer server = Peer::start(0);
  ASSERT_NE(server.port, 0);
  auto t0 = Clock::now();
  Peer flooder = Peer::run({"flood", std::to_string(server.port), "3"});
  EXPECT_EQ(flooder.line, "flooding\n");
  int calls = 0, ok = 0, refused = 0;
  std::string refusal;
  while (ms_since(t0) < 3000) {
    auto fresh = start_client(kKey);  // a fresh handshake each time
    std::vector<char> reply;
    Status status = fresh->call("127.0.0.1", server.port, "e", reply, 1000, 1024);
    ++calls;
    ok += status.ok();
    if (status.code == Code::refused && !refused++) refusal = status.text;
  }
  waitpid(flooder.pid, nullptr, 0);
  server.stop();
  printf("[ churn from the caller's address ] %d fresh handshakes, %d served, %d refused\n", calls,
         ok, refused);
  EXPECT_EQ(refused, 0) << refusal;
  EXPECT_GT(calls, 0);
}

// An answer whose payload is not the one its MAC covers is never taken: an
// eager one is dropped before it touches the call, which waits for a genuine
// one (none comes from this server: the call times out).
TEST_F(PeersTest, ATamperedAnswerIsNeverTaken) {
  Peer tamperer = Peer::run({"tamper", kKey});
  ASSERT_NE(tamperer.port, 0) << "the tamperer did not start";
  std::vector<char> reply;
  Status status = call(tamperer.port, "eany", reply, 2000);
  tamperer.stop();
  EXPECT_EQ(status.code, Code::timeout) << status.text;
  EXPECT_TRUE(reply.empty());
}

// A front door that takes only the job's addresses closes at once on a
// caller from another one, unread.
TEST_F(PeersTest, ACallerFromAnotherAddressIsRejected) {
  Peer only = Peer::run({"0", kKey, "10.255.255.1"});
  ASSERT_NE(only.port, 0);
  std::vector<char> reply;
  Status status = call(only.port, "e", reply, 3000);
  EXPECT_EQ(status.code, Code::unreachable) << status.text;
  EXPECT_NE(status.text.find("closed the connection at once"), std::string::npos) << status.text;
  Peer loopback = Peer::run({"0", kKey, "127.0.0.1"});
  EXPECT_TRUE(call(loopback.port, "e", reply, 3000).ok());
  // From a job's address, with the key, but not the node of that address.
  std::string error;
  auto impostor = Peers::start(
      {.bind_address = "127.0.0.1", .key = kKey, .identity = "node9"},
      [](std::vector<char>, Reply reply) { reply.fail("client only"); }, error);
  ASSERT_TRUE(impostor) << error;
  status = impostor->call("127.0.0.1", loopback.port, "e", reply, 3000, 1024);
  EXPECT_EQ(status.code, Code::unreachable) << status.text;
  EXPECT_NE(status.text.find("closed the connection before its welcome"), std::string::npos)
      << status.text;
  only.stop();
  loopback.stop();
}

// The job's ports: a port taken by someone who accepts and stays silent (a
// squatter) or by another job costs nothing. The stager listens on the next
// candidate; a caller tries them in order, each within a share of its
// timeout, and is served within it.
TEST(PeersPorts, ASilentSquatterOnTheFirstCandidateCostsNothing) {
  const std::string key = "job-ports-secret";
  auto candidates = wire::port_candidates(key, 20000, 20499);
  ASSERT_GE(candidates.size(), 2u);
  int squat = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{.sin_family = AF_INET,
                .sin_port = htons(candidates[0]),
                .sin_addr = {htonl(INADDR_LOOPBACK)}};
  ASSERT_EQ(bind(squat, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
  ASSERT_EQ(listen(squat, 16), 0);  // never accepts, never writes
  auto start = [&](const char* name) {
    std::string error;
    auto peers = Peers::start(
        {.bind_address = "127.0.0.1",
         .port_low = 20000,
         .port_high = 20499,
         .key = key,
         .identity = name},
        [](std::vector<char> request, Reply reply) { reply.send(std::move(request)); }, error);
    EXPECT_TRUE(peers) << error;
    return peers;
  };
  auto server = start("127.0.0.1");
  auto client = start("client");
  ASSERT_TRUE(server && client);
  EXPECT_EQ(server->port(), candidates[1]);
  std::vector<char> reply;
  auto t0 = Clock::now();
  Status status = client->call("127.0.0.1", 0, "hello", reply, 1000, 1024);
  ASSERT_TRUE(status.ok()) << status.text;
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "hello");
  printf("[ squatted first port ] first call %ld ms (the squatter's share: 250 ms)\n",
         ms_since(t0));
  t0 = Clock::now();
  ASSERT_TRUE(client->call("127.0.0.1", 0, "again", reply, 1000, 1024).ok());
  EXPECT_LT(ms_since(t0), 200) << "the session on the second port was not kept";
  close(squat);
}

// /proc/PID/status's VmRSS, in bytes; /proc/PID/stat's CPU time, in seconds.
size_t rss_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string word;
  while (in >> word)
    if (word == "VmRSS:") {
      size_t kb = 0;
      in >> kb;
      return kb << 10;
    }
  return 0;
}
double cpu_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  unsigned long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoul(field);
    if (i == 15) stime = std::stoul(field);
  }
  return double(utime + stime) / double(sysconf(_SC_CLK_TCK));
}

// /proc/PID/status's VmHWM (peak resident), in bytes.
size_t hwm_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string word;
  while (in >> word)
    if (word == "VmHWM:") {
      size_t kb = 0;
      in >> kb;
      return kb << 10;
    }
  return 0;
}

// One Peers of this process serving `echo` (its own text) on the first free
// port of [low, high] for `key`; null with `error` when it cannot start.
// A caller of the job has the range too, and listens elsewhere (`port`).
std::unique_ptr<Peers> echo_server(const std::string& key, uint16_t low, uint16_t high,
                                   const std::string& echo, std::string& error,
                                   const char* identity = "127.0.0.1", uint16_t port = 0) {
  return Peers::start(
      {.bind_address = "127.0.0.1",
       .port = port,
       .port_low = low,
       .port_high = high,
       .key = key,
       .identity = identity},
      [echo](std::vector<char>, Reply reply) {
        reply.send({echo.begin(), echo.end()});
      },
      error);
}

// A caller that never takes its answers (a node stopped, or cut off without
// its connection failing) asks a stager 64 times for a piece of 4 MiB,
// while two callers ask for pieces flat out, one asks allowing 1 byte and one
// gives up after 1 ms. The stager holds at most Limits::answer_bytes (16 MiB
// here) of answers at once: its peak memory grows by no more than that and
// some slack (without the bound it held every answer sent to the stalled
// caller: +260 MiB for 64, +388 MiB for 96). Callers past the bound are told
// `busy`, nothing else fails, and once the stalled caller is gone its
// answers are let go and calls are served again.
TEST_F(PeersTest, ACallerThatTakesNoAnswerHoldsAtMostAnswerBytes) {
  constexpr size_t kPiece = 4 << 20, kBound = 16 << 20, kSlack = 32 << 20;
  Peer server = Peer::run({"bounded", std::to_string(kBound), "600000", "0", kKey});
  ASSERT_NE(server.port, 0) << server.line;
  const std::string piece = "n" + std::to_string(kPiece);
  std::vector<char> reply;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(call(server.port, piece, reply).ok());
  size_t hwm0 = hwm_of(server.pid);
  Peer hog = Peer::run({"hog", std::to_string(server.port), kKey, "64", std::to_string(kPiece)});
  EXPECT_EQ(hog.line, "asked\n");
  std::atomic<int> served{0}, busy{0}, failed{0};
  std::string failure;
  std::mutex failure_mutex;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      // The one that gives up at once makes a session per call (it hears
      // nothing): from an address of its own, as another node, so that its
      // sessions replace only its own.
      auto caller = start_client(kKey, t == 3 ? "127.0.0.3" : "127.0.0.1");
      std::vector<char> r;
      auto t0 = Clock::now();
      while (ms_since(t0) < 3000) {
        // 0, 1: flat out; 2: takes at most 1 byte; 3: waits 1 ms.
        Status st = caller->call("127.0.0.1", server.port, piece, r, t == 3 ? 1 : 5000,
                                 t == 2 ? 1 : kMaxAnswer);
        if (t >= 2) continue;
        if (st.ok() && r.size() == kPiece) {
          ++served;
        } else if (st.code == Code::busy) {
          ++busy;
        } else {
          ++failed;
          std::lock_guard lock(failure_mutex);
          failure = st.text;
        }
      }
    });
  for (auto& t : threads) t.join();
  size_t hwm1 = hwm_of(server.pid);
  hog.stop();
  auto t0 = Clock::now();
  Status st;
  while (!(st = call(server.port, piece, reply)).ok() && ms_since(t0) < 10000)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(st.ok()) << "not served once the stalled caller is gone: " << st.text;
  long back_ms = ms_since(t0);
  ASSERT_TRUE(call(server.port, "h", reply).ok());
  Held held;
  std::istringstream(std::string(reply.begin(), reply.end())) >> held.answers >> held.bytes >>
      held.peak_answers >> held.peak_bytes >> held.busy >> held.too_large;
  printf(
      "[ stalled caller ] stager VmHWM +%zu MiB (bound %zu MiB); answers held at most %llu, "
      "%llu MiB; %llu answered busy; the flat-out callers: %d served, %d busy, %d failed; served "
      "again %ld ms after the stalled caller went\n",
      (hwm1 - hwm0) >> 20, kBound >> 20, (unsigned long long)held.peak_answers,
      (unsigned long long)(held.peak_bytes >> 20), (unsigned long long)held.busy, served.load(),
      busy.load(), failed.load(), back_ms);
  EXPECT_EQ(failed, 0) << failure;
  EXPECT_LE(held.peak_bytes, kBound);
  EXPECT_GE(held.peak_bytes, kBound - kPiece) << "the stalled caller never filled the bound";
  EXPECT_GT(held.busy, 0u);
  EXPECT_EQ(held.answers, 0u) << "answers still counted once all were done with";
  EXPECT_EQ(held.bytes, 0u);
  if (!kSanitized) {
    EXPECT_LT(hwm1 - hwm0, kBound + kSlack);
  }
  server.stop();
}

// The same stalled caller, alive: once its answers have waited
// Limits::answer_ms (3 s here), its session ends, its answers are let go, and
// the others are served again.
TEST_F(PeersTest, AStalledCallersAnswersAreLetGoAfterAnswerMs) {
  constexpr size_t kPiece = 4 << 20, kBound = 16 << 20;
  Peer server = Peer::run({"bounded", std::to_string(kBound), "3000", "0", kKey});
  ASSERT_NE(server.port, 0) << server.line;
  const std::string piece = "n" + std::to_string(kPiece);
  std::vector<char> reply;
  ASSERT_TRUE(call(server.port, piece, reply).ok());
  Peer hog = Peer::run({"hog", std::to_string(server.port), kKey, "32", std::to_string(kPiece)});
  ASSERT_EQ(hog.line, "asked\n");
  Status st = call(server.port, piece, reply);
  EXPECT_EQ(st.code, Code::busy) << "the stalled caller held no answer: " << st.text;
  auto t0 = Clock::now();
  while (!(st = call(server.port, piece, reply)).ok() && ms_since(t0) < 20000)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(st.ok()) << st.text;
  EXPECT_EQ(reply.size(), kPiece);
  EXPECT_EQ(waitpid(hog.pid, nullptr, WNOHANG), 0) << "the stalled caller went";
  printf(
      "[ stalled caller ] served again %ld ms after told busy (answer_ms 3000), it still alive\n",
      ms_since(t0));
  hog.stop();
  server.stop();
}

// An answer over Limits::max_answer (a handler's bug) is refused: its caller
// gets `error`, whatever it allowed, and the stager serves on. A Peers whose
// max_answer exceeds its answer_bytes does not start.
TEST_F(PeersTest, AnAnswerOverMaxAnswerIsRefusedAndTheStagerServesOn) {
  std::vector<char> reply;
  Status st = call(shared.port, "n" + std::to_string(kMaxAnswer + 1), reply, 5000, 2 * kMaxAnswer);
  EXPECT_EQ(st.code, Code::error) << st.text;
  EXPECT_NE(st.text.find("more than the " + std::to_string(kMaxAnswer) + " one may be"),
            std::string::npos)
      << st.text;
  EXPECT_TRUE(reply.empty());
  st = call(shared.port, "n" + std::to_string(kMaxAnswer), reply);
  ASSERT_TRUE(st.ok()) << st.text;
  EXPECT_EQ(reply.size(), kMaxAnswer);
  ASSERT_TRUE(call(shared.port, "h", reply).ok());
  Held held;
  std::istringstream(std::string(reply.begin(), reply.end())) >> held.answers >> held.bytes >>
      held.peak_answers >> held.peak_bytes >> held.busy >> held.too_large;
  EXPECT_GE(held.too_large, 1u);

  std::string error;
  auto bad = Peers::start(
      {.bind_address = "127.0.0.1",
       .key = kKey,
       .identity = "x",
       .limits = {.answer_bytes = 1 << 20}},
      [](std::vector<char>, Reply) {}, error);
  EXPECT_FALSE(bad);
  EXPECT_NE(error.find("could never be sent"), std::string::npos) << error;
}

// The job's port candidates: the whole range in an order of the key's when
// it is small, kPortCandidates distinct ports of it when large; each key its
// own order.
TEST(PeersPorts, CandidatesAreTheKeysOrderOfTheRange) {
  auto a = wire::port_candidates("key-a", 30000, 30009);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint16_t> range;
  for (uint16_t p = 30000; p <= 30009; ++p) range.push_back(p);
  EXPECT_EQ(sorted, range);
  EXPECT_EQ(a, wire::port_candidates("key-a", 30000, 30009));
  EXPECT_NE(a, wire::port_candidates("key-b", 30000, 30009));
  auto wide = wire::port_candidates("key-a", 1024, 65535);
  EXPECT_EQ(wide.size(), wire::kPortCandidates);
  EXPECT_EQ(std::set<uint16_t>(wide.begin(), wide.end()).size(), wide.size());
  for (uint16_t p : wide) EXPECT_GE(p, 1024);
  EXPECT_TRUE(wire::port_candidates("key-a", 0, 10).empty());
  EXPECT_TRUE(wire::port_candidates("key-a", 10, 9).empty());
  EXPECT_EQ(wire::port_candidates("key-a", 65535, 65535), std::vector<uint16_t>{65535});
}

// Two jobs on one node, a range of two ports, their keys' first candidates
// the same: both listen (the second on its other candidate), and each job's
// caller reaches its own job's stager, the second after one try at the other
// job's. A third job finds the range taken and does not start, saying so.
TEST(PeersPorts, TwoJobsOnARangeOfTwoPortsEachReachTheirOwn) {
  const uint16_t low = 23170, high = 23171;
  const std::string key_a = "job-a-secret";
  std::string key_b;
  for (int i = 0; key_b.empty() || wire::port_candidates(key_b, low, high)[0] !=
                                       wire::port_candidates(key_a, low, high)[0];
       ++i)
    key_b = "job-b-secret-" + std::to_string(i);
  std::string error;
  auto a = echo_server(key_a, low, high, "job a", error);
  ASSERT_TRUE(a) << error;
  auto b = echo_server(key_b, low, high, "job b", error);
  ASSERT_TRUE(b) << error;
  EXPECT_EQ(a->port(), wire::port_candidates(key_a, low, high)[0]);
  EXPECT_EQ(b->port(), wire::port_candidates(key_b, low, high)[1]);
  for (const auto& [key, echo] : {std::pair{key_a, "job a"}, {key_b, "job b"}}) {
    auto caller = echo_server(key, low, high, "", error, "caller", 23180);
    ASSERT_TRUE(caller) << error;
    for (int i = 0; i < 2; ++i) {
      std::vector<char> reply;
      Status st = caller->call("127.0.0.1", 0, "x", reply, 2000, 64);
      ASSERT_TRUE(st.ok()) << echo << ", call " << i << ": " << st.text;
      EXPECT_EQ(std::string(reply.begin(), reply.end()), echo);
    }
  }
  auto c = echo_server("job-c-secret", low, high, "job c", error);
  EXPECT_FALSE(c);
  EXPECT_NE(error.find("all 2 of the job's port candidates are taken"), std::string::npos) << error;
}

// The first 20 of a job's 40 candidates taken on the node (bound by another
// program, not listening: a connection there is refused at once): the stager
// listens on its 21st. A caller's first call tries 16 candidates and fails,
// saying so; its next call goes on from there and is served; later calls
// go straight to the port that proved the key.
TEST(PeersPorts, ACallerGoesOnWhereItsLastCallLeftOff) {
  const uint16_t low = 23200, high = 23239;
  const std::string key = "job-search-secret";
  auto candidates = wire::port_candidates(key, low, high);
  ASSERT_EQ(candidates.size(), 40u);
  std::vector<int> taken;
  for (size_t i = 0; i < 20; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{.sin_family = AF_INET,
                  .sin_port = htons(candidates[i]),
                  .sin_addr = {htonl(INADDR_LOOPBACK)}};
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0)
        << candidates[i] << ": " << strerror(errno);
    taken.push_back(fd);
  }
  std::string error;
  auto server = echo_server(key, low, high, "found", error);
  ASSERT_TRUE(server) << error;
  EXPECT_EQ(server->port(), candidates[20]);
  auto caller = echo_server(key, low, high, "", error, "caller", 23190);
  ASSERT_TRUE(caller) << error;
  std::vector<char> reply;
  Status st = caller->call("127.0.0.1", 0, "x", reply, 5000, 64);
  EXPECT_EQ(st.code, Code::unreachable) << st.text;
  EXPECT_NE(st.text.find("16 of the job's 40 port candidates tried"), std::string::npos) << st.text;
  for (int i = 0; i < 2; ++i) {
    st = caller->call("127.0.0.1", 0, "x", reply, 5000, 64);
    ASSERT_TRUE(st.ok()) << "call " << i << ": " << st.text;
    EXPECT_EQ(std::string(reply.begin(), reply.end()), "found");
  }
  for (int fd : taken) close(fd);
}

// With the job's nodes given (Options::hosts), a name not among them is
// `unreachable` without a name lookup (one could hang); `localhost`, which
// resolves here, shows it: without hosts it is looked up and called.
TEST_F(PeersTest, ANameNotAmongTheJobsNodesIsNeverLookedUp) {
  std::string error;
  auto with_hosts = Peers::start(
      {.bind_address = "127.0.0.1",
       .key = kKey,
       .identity = "127.0.0.1",
       .hosts = {{"127.0.0.1", "127.0.0.1"}}},
      [](std::vector<char>, Reply reply) { reply.fail("client"); }, error);
  ASSERT_TRUE(with_hosts) << error;
  std::vector<char> reply;
  Status st = with_hosts->call("localhost", shared.port, "e", reply, 2000, 64);
  EXPECT_EQ(st.code, Code::unreachable) << st.text;
  EXPECT_NE(st.text.find("never looked up"), std::string::npos) << st.text;
  st = with_hosts->call("127.0.0.1", shared.port, "eyes", reply, 2000, 64);
  EXPECT_TRUE(st.ok()) << st.text;
  // Without hosts: resolved and called (the peer, named 127.0.0.1, then
  // closes the door on a caller that asked for "localhost").
  st = client->call("localhost", shared.port, "e", reply, 2000, 64);
  EXPECT_EQ(st.text.find("never looked up"), std::string::npos) << st.text;
  EXPECT_NE(st.text.find("closed the connection"), std::string::npos) << st.text;
}

// The TCP ports `pid` listens on (its sockets in /proc/net/tcp, LISTEN).
std::vector<uint16_t> listening_ports(pid_t pid) {
  std::set<std::string> inodes;
  std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(fds)) {
    std::error_code ec;
    std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<uint16_t> ports;
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  std::getline(tcp, line);
  while (std::getline(tcp, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (state == "0A" && inodes.count(inode))
      ports.push_back(uint16_t(std::stoul(local.substr(local.find(':') + 1), nullptr, 16)));
  }
  return ports;
}

// One stranger's flood (peers_peer.cpp: `args`) for 4 s while this process
// calls the server every 10 ms with the job's default peer timeout. Prints
// what it saw; the server's peak RSS over rss0 goes to `grew`.
struct FloodSeen {
  int calls = 0, failed = 0;
  long slowest = 0;
  size_t grew = 0;
  std::string first_failure;
};
FloodSeen flood(PeersTest& t, const Peer& server, size_t rss0, std::vector<std::string> args,
                const char* what) {
  constexpr int kTimeoutMs = 1000;  // the job's peer_timeout by default
  FloodSeen seen;
  double cpu0 = cpu_of(server.pid);
  auto t0 = Clock::now();
  Peer flooder = Peer::run(args);
  EXPECT_EQ(flooder.line, "flooding\n");
  size_t peak = rss0;
  std::vector<char> reply;
  while (ms_since(t0) < 4000) {
    auto c0 = Clock::now();
    Status status = t.call(server.port, "n4096", reply, kTimeoutMs);
    seen.slowest = std::max(seen.slowest, ms_since(c0));
    ++seen.calls;
    if ((!status.ok() || reply.size() != 4096) && !seen.failed++) seen.first_failure = status.text;
    peak = std::max(peak, rss_of(server.pid));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  waitpid(flooder.pid, nullptr, 0);
  double cpu = (cpu_of(server.pid) - cpu0) / (ms_since(t0) / 1000.0);
  seen.grew = peak > rss0 ? peak - rss0 : 0;
  printf(
      "[ flood: %s ] %d calls, %d failed, slowest %ld ms; stager RSS %zu MiB before, +%zu KiB at "
      "peak; stager CPU %.2f of a core\n",
      what, seen.calls, seen.failed, seen.slowest, rss0 >> 20, seen.grew >> 10, cpu);
  return seen;
}

// A stranger floods a stager's front door from 4 threads (connections
// closed at once, 64 bytes of garbage, wrong Proofs, Proofs that announce
// the largest address and stall, idle connections): nothing of it reaches
// UCX. The job's own calls keep succeeding within the job's default peer
// timeout, the stager stays alive, and holds at most kBound more: the
// handshakes it keeps (16, about 4 KiB each) and the sockets' buffers.
// Then the same with, in addition, UCX messages straight to the stager's
// worker, as a stranger who read its address on the network sends them
// (requests of sessions it guesses, eager ones of 1 MiB, rendezvous ones of
// 64 MiB, garbage): none is served; UCX assembles each eager message whole
// before the stager drops it, so what that costs is UCX's (kUcxBound, the
// measured peak with room).
TEST_F(PeersTest, AFloodWithoutTheKeyCostsBoundedMemoryAndNoCall) {
  constexpr size_t kBound = 8 << 20, kUcxBound = 64 << 20;
  Peer server = Peer::start(0);
  ASSERT_NE(server.port, 0);
  std::vector<char> reply;
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(call(server.port, "n4096", reply, 1000).ok());
  size_t rss0 = rss_of(server.pid);
  FloodSeen door =
      flood(*this, server, rss0, {"flood", std::to_string(server.port), "4"}, "front door");
  EXPECT_EQ(door.failed, 0) << door.first_failure;
  if (!kSanitized) {
    EXPECT_LT(door.grew, kBound);
  }
  ASSERT_EQ(waitpid(server.pid, nullptr, WNOHANG), 0) << "the stager died";
  FloodSeen ucx =
      flood(*this, server, rss0, {"flood", std::to_string(server.port), "4", server.address},
            "front door and UCX");
  EXPECT_EQ(ucx.failed, 0) << ucx.first_failure;
  if (!kSanitized) {
    EXPECT_LT(ucx.grew, kUcxBound);
  }
  ASSERT_TRUE(call(server.port, "eafter", reply).ok());
  server.stop();
}

// UCX's own transport listener (TCP, a random port of the worker: every
// port the stager listens on but its front door) takes connections from
// anyone. Churn and garbage there (connections closed at once, or 64 zero
// bytes then closed, from 4 threads for 4 s each) must not stop the stager,
// which serves as before once they end. Known limit, printed, not asserted:
// while they last, UCX 1.13.1 holds thousands of those connections (11,800
// descriptors seen) and some of the job's calls time out (1 to 4 of 4 to 15
// here, on 2 cores).
TEST_F(PeersTest, GarbageOnUcxsOwnListenerLeavesTheStagerServing) {
  Peer server = Peer::start(0);
  ASSERT_NE(server.port, 0);
  std::vector<char> reply;
  ASSERT_TRUE(call(server.port, "ewarm", reply, 1000).ok());
  std::vector<uint16_t> ports = listening_ports(server.pid);
  ports.erase(std::remove(ports.begin(), ports.end(), server.port), ports.end());
  ASSERT_FALSE(ports.empty()) << "no listener of UCX's found";
  size_t rss0 = rss_of(server.pid);
  for (uint16_t port : ports)
    for (const char* kind : {"churn", "zeros"}) {
      std::string what = std::string(kind) + " on UCX's listener " + std::to_string(port);
      FloodSeen seen =
          flood(*this, server, rss0, {"garbage", std::to_string(port), "4", kind}, what.c_str());
      ASSERT_EQ(waitpid(server.pid, nullptr, WNOHANG), 0) << "the stager died";
      if (seen.failed) printf("[ known limit ] %s\n", seen.first_failure.c_str());
      ASSERT_TRUE(call(server.port, "eafter", reply, 1000).ok()) << "not serving after " << what;
    }
  ASSERT_TRUE(call(server.port, "eafter", reply).ok());
  server.stop();
}

// The soft limit of open files of a job's processes is often 1024 (Slurm
// passes the submitting shell's on), and UCX keeps each connection to its
// listener open a while: garbage there made UCX's accept() fail at the limit
// and drop its listener for good, and every later session failed. A stager
// started under a soft limit of 1024 raises it to its hard limit, and takes
// new callers after the same garbage.
TEST_F(PeersTest, UnderASoftLimitOf1024GarbageOnUcxsListenerLeavesNewCallersServed) {
  rlimit was{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &was), 0);
  if (was.rlim_max != RLIM_INFINITY && was.rlim_max < 16384)
    GTEST_SKIP() << "the hard limit of open files here is " << was.rlim_max
                 << ": too low to show the soft one raised (16384 at least)";
  rlimit low = {1024, was.rlim_max};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  Peer server = Peer::start(0);  // inherits the soft limit of 1024
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &was), 0);
  ASSERT_NE(server.port, 0);
  std::ifstream limits("/proc/" + std::to_string(server.pid) + "/limits");
  std::string line, soft;
  while (std::getline(limits, line))
    if (line.rfind("Max open files", 0) == 0) std::istringstream(line.substr(14)) >> soft;
  EXPECT_EQ(soft, was.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(was.rlim_max));
  std::vector<char> reply;
  ASSERT_TRUE(call(server.port, "ewarm", reply, 1000).ok());
  std::vector<uint16_t> ports = listening_ports(server.pid);
  ports.erase(std::remove(ports.begin(), ports.end(), server.port), ports.end());
  ASSERT_FALSE(ports.empty()) << "no listener of UCX's found";
  size_t rss0 = rss_of(server.pid);
  for (uint16_t port : ports) {
    std::string what = "churn on UCX's listener " + std::to_string(port) + ", soft limit 1024";
    flood(*this, server, rss0, {"garbage", std::to_string(port), "4", "churn"}, what.c_str());
  }
  ASSERT_EQ(waitpid(server.pid, nullptr, WNOHANG), 0) << "the stager died";
  // New callers: each needs UCX's listener to take its endpoint.
  for (int i = 0; i < 3; ++i) {
    auto fresh = start_client(kKey);
    Status status = fresh->call("127.0.0.1", server.port, "enew", reply, 5000, 1024);
    ASSERT_TRUE(status.ok()) << "caller " << i << " after the garbage: " << status.text;
  }
  server.stop();
}

// An answer longer than the caller allows is an error, and never allocated,
// eager or by rendezvous; the connection serves on.
TEST_F(PeersTest, AnswersAboveMaxReplyAreErrorsNeverAllocated) {
  std::vector<char> reply;
  ASSERT_TRUE(call(shared.port, "n1000", reply, 5000, 1000).ok());
  EXPECT_EQ(reply.size(), 1000u);
  Status status = call(shared.port, "n1000", reply, 5000, 999);
  EXPECT_EQ(status.code, Code::error) << status.text;
  EXPECT_TRUE(reply.empty());

  std::vector<char> fresh;
  largest_allocation = 0;
  status = call(shared.port, "n" + std::to_string(4 << 20), fresh, 5000, 1 << 20);
  EXPECT_EQ(status.code, Code::error) << status.text;
  EXPECT_NE(status.text.find("more than the 1048576 asked for"), std::string::npos) << status.text;
  EXPECT_LT(largest_allocation.load(), size_t{1} << 20);
  EXPECT_TRUE(fresh.empty());
  ASSERT_TRUE(call(shared.port, "eon", reply).ok());
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "on");
}

TEST_F(PeersTest, HandlersAnswerLaterFromAnotherThreadOrFailCleanly) {
  std::vector<char> reply;
  auto t0 = Clock::now();
  Status status = call(shared.port, "s150", reply);
  ASSERT_TRUE(status.ok()) << status.text;
  EXPECT_GE(ms_since(t0), 150);
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "slept");

  status = call(shared.port, "d", reply);
  EXPECT_EQ(status.code, Code::error);
  EXPECT_NE(status.text.find("dropped without a reply"), std::string::npos) << status.text;
  status = call(shared.port, "x", reply);
  EXPECT_EQ(status.code, Code::error);
  EXPECT_TRUE(reply.empty());
  EXPECT_TRUE(call(shared.port, "e", reply).ok()) << "the peer still serves";
}

// A call never outlives its timeout, whatever the peer does; late answers
// are dropped, and the next call gets its own.
TEST_F(PeersTest, SlowAnswerTimesOutAndTheNextCallGetsItsOwnAnswer) {
  std::vector<char> reply;
  auto t0 = Clock::now();
  Status status = call(shared.port, "s400", reply, 100);
  long took = ms_since(t0);
  EXPECT_EQ(status.code, Code::timeout) << status.text;
  EXPECT_GE(took, 100);
  EXPECT_LT(took, 180);
  ASSERT_TRUE(call(shared.port, "emine", reply).ok());
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "mine");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the late answer arrives
  ASSERT_TRUE(call(shared.port, "emine2", reply).ok());
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "mine2");
}

TEST_F(PeersTest, KilledPeerFailsCallsAtOnce) {
  Peer peer = Peer::start(0);
  ASSERT_NE(peer.port, 0);
  std::vector<char> reply;
  ASSERT_TRUE(call(peer.port, "ewarm", reply).ok());

  auto waiting = std::async(std::launch::async, [&] {
    std::vector<char> r;
    return call(peer.port, "s3000", r, 5000);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto killed = Clock::now();
  peer.stop();
  Status status = waiting.get();
  long pending_ms = ms_since(killed);
  EXPECT_EQ(status.code, Code::unreachable) << status.text;
  EXPECT_LT(pending_ms, 1000);

  auto t0 = Clock::now();
  status = call(peer.port, "eagain", reply, 5000);
  long fresh_ms = ms_since(t0);
  EXPECT_EQ(status.code, Code::unreachable) << status.text;
  EXPECT_LT(fresh_ms, 1000);
  printf("[ kill -9 ] a waiting call failed %ld ms after the kill; a new call %ld ms (%s)\n",
         pending_ms, fresh_ms, status.text.c_str());
}

TEST_F(PeersTest, StoppedPeerTimesOutThenServesAgain) {
  Peer peer = Peer::start(0);
  ASSERT_NE(peer.port, 0);
  std::vector<char> reply;
  ASSERT_TRUE(call(peer.port, "ewarm", reply).ok());
  ASSERT_TRUE(peer.pause());
  auto t0 = Clock::now();
  Status status = call(peer.port, "estopped", reply, 300);
  long took = ms_since(t0);
  EXPECT_EQ(status.code, Code::timeout) << status.text;
  EXPECT_GE(took, 300);
  EXPECT_LT(took, 380);
  peer.signal(SIGCONT);
  status = call(peer.port, "eback", reply, 2000);
  EXPECT_TRUE(status.ok()) << status.text;
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "back");
  printf("[ SIGSTOP ] call returned after %ld ms (timeout 300 ms)\n", took);
  peer.stop();
}

TEST_F(PeersTest, ReconnectsToAPeerRestartedOnTheSamePort) {
  Peer first = Peer::start(0);
  ASSERT_NE(first.port, 0);
  uint16_t port = first.port;
  std::vector<char> reply;
  ASSERT_TRUE(call(port, "eone", reply).ok());
  first.stop();
  Peer second = Peer::start(port);
  ASSERT_EQ(second.port, port) << "the port could not be reused";
  Status status = call(port, "etwo", reply, 2000);
  ASSERT_TRUE(status.ok()) << status.text;
  EXPECT_EQ(std::string(reply.begin(), reply.end()), "two");
  second.stop();
}

// What a stager gets without UCX_TLS: UCX's own choice less shared memory.
// Fails if that setting is not valid UCX configuration or leaves no
// transport. (That it is TCP here, between two Peers of one process, which
// UCX would otherwise join through shared memory: UCX_LOG_LEVEL=info shows
// "ep_cfg[..]: am(tcp/lo)".) Devices stay on the loopback.
TEST(PeersDefaults, TransportsNeedNoSharedMemory) {
  std::string tls = getenv("UCX_TLS");
  unsetenv("UCX_TLS");
  std::string error;
  Options options{.bind_address = "127.0.0.1", .key = kKey, .identity = "127.0.0.1"};
  auto server = Peers::start(
      options,
      [](std::vector<char> request, Reply reply) {
        reply.send(std::vector<char>(1 << 20, request.empty() ? '?' : request[0]));
      },
      error);
  auto client = Peers::start(
      options, [](std::vector<char>, Reply reply) {}, error);
  setenv("UCX_TLS", tls.c_str(), 1);
  ASSERT_TRUE(server && client) << error;
  std::string payload(1 << 20, 'z');
  std::vector<char> reply;
  Status status = client->call("127.0.0.1", server->port(), "z", reply, 5000, 1 << 20);
  ASSERT_TRUE(status.ok()) << status.text;
  EXPECT_TRUE(std::equal(reply.begin(), reply.end(), payload.begin(), payload.end()));
}

TEST_F(PeersTest, NobodyListeningIsUnreachableAtOnce) {
  Peer peer = Peer::start(0);
  uint16_t port = peer.port;
  peer.stop();  // a port that was just free
  std::vector<char> reply;
  auto t0 = Clock::now();
  Status status = call(port, "e", reply, 3000);
  EXPECT_EQ(status.code, Code::unreachable) << status.text;
  EXPECT_LT(ms_since(t0), 1000);
}

// IPv4 only (peers.cpp, resolve: UCX 1.13 overruns a buffer when it accepts
// an IPv6 connection): an IPv6 address to listen on, or to call, is a clear
// error, never a listener or a connection.
TEST_F(PeersTest, IPv6IsAClearErrorNeverAConnection) {
  std::string error;
  auto v6 = Peers::start(
      {.bind_address = "::1", .key = kKey, .identity = "::1"}, [](std::vector<char>, Reply) {},
      error);
  EXPECT_EQ(v6, nullptr);
  EXPECT_NE(error.find("'::1' to an IPv4 address"), std::string::npos) << error;
  std::vector<char> reply;
  Status status = client->call("::1", shared.port, "e", reply, 3000, 1024);
  EXPECT_EQ(status.code, Code::unreachable) << status.text;
  EXPECT_NE(status.text.find("IPv4 only"), std::string::npos) << status.text;
}

}  // namespace
}  // namespace monarch::peers
