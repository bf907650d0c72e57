// Stagers of one job in one process, over real UCX (TCP): node 0 listens
// on the loopback's 127.0.0.1, node 1 on the machine's first other IPv4
// address, on the same port. Each has its own job map and tier and copies
// from the same dataset. What a node does when another node's stager goes
// away and comes back (jobwide.h, Faults), and which node walks the dataset
// when the first node's port is taken by a stranger (jobwide.h, One index per
// job: three nodes, the first at 127.0.0.2).
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "copier.h"
#include "counters.h"
#include "index.h"
#include "index_wire.h"
#include "jobwide.h"
#include "placement.h"

#include "free_port.h"
#include "sanitized.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Got = PeerSource::Got;

// The machine's first IPv4 address outside the loopback on an interface up
// and running, and that interface.
struct Iface {
  std::string name, address;
};
Iface other_ipv4() {
  ifaddrs* list = nullptr;
  Iface out;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i && out.name.empty(); i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && (i->ifa_flags & IFF_UP) &&
        (i->ifa_flags & IFF_RUNNING) && !(i->ifa_flags & IFF_LOOPBACK)) {  // as UCX takes one
      char text[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
      out = {i->ifa_name, text};
    }
  freeifaddrs(list);
  return out;
}
const Iface other = other_ipv4();

const bool tcp_only = [] {
  setenv("UCX_TLS", "tcp", 1);
  setenv("UCX_NET_DEVICES", ("lo," + other.name).c_str(), 1);
  return true;
}();

// The job's peer_timeout in these tests: room for node 1's restart on a loaded
// machine; a node away is not asked for min(1 s, a quarter of it).
constexpr unsigned kTimeoutMs = 5000;
constexpr size_t kFileBytes = 64 << 10;
// How long a node waits for the index in all (the stager's start_timeout):
// far longer than any node is waited for before it is out.
constexpr unsigned kIndexWaitMs = 60000;

long ms_since(Clock::time_point t) {
  return long(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

// A job's nodes (their names are the addresses they listen on) and settings.
struct Job {
  std::vector<std::string> nodes;
  uint16_t port = 0;
  unsigned timeout_ms = kTimeoutMs;
  // false: every node walks the dataset itself (the same walk: the same
  // index). true: as the stager does, the node that walks() walks and every
  // other node fetches the index (which throws when it does not come).
  bool elect = false;
  uint64_t piece_bytes = kMaxPiece;  // the index's pieces
};

// The whole file `fd` holds, `size` bytes.
std::string contents(int fd, uint64_t size) {
  std::string out(size, '\0');
  return pread(fd, out.data(), size, 0) == ssize_t(size) ? out : std::string();
}

// One node's stager: its job map, tier, copier and job-wide cache, serving.
struct Node {
  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  fs::path tier;
  MappedMap map;
  int root_fd = -1, tier_fd = -1;
  std::unique_ptr<Placement> placement;
  std::unique_ptr<JobWide> jw;
  std::unique_ptr<Copier> copier;
  std::string index_why;  // why fetch_index() sent no index, when it did not

  Node(const fs::path& root, const fs::path& tier_dir, int self, const Job& job) : tier(tier_dir) {
    fs::remove_all(tier);
    fs::create_directories(tier / kTmpDir);
    fs::create_directories(tier / kDataDir);
    root_fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    tier_fd = open(tier.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    std::string error;
    jw = JobWide::start({.nodes = job.nodes,
                         .self = self,
                         .port_low = job.port,
                         .port_high = job.port,
                         .address = job.nodes[self],
                         .key = "job-77-secret",
                         .timeout_ms = job.timeout_ms,
                         .index_wait_ms = kIndexWaitMs,
                         .wire_dir = tier_fd,
                         .piece_bytes = job.piece_bytes},
                        counters, error);
    if (!jw) throw std::runtime_error("node " + std::to_string(self) + ": " + error);
    IndexOptions io{.root = root.string(),
                    .out_path = (tier / "index").string(),
                    .tier_dirs = {tier.string()},
                    .stall_ns = 200'000'000,
                    .generation = uint64_t(self) + 1};
    IndexStats st;
    std::optional<IndexFile> wire;
    if (job.elect && !jw->walks()) {
      bool final = false;
      wire = jw->fetch_index(kIndexWaitMs, index_why, final);
      if (!wire && !jw->walks())
        throw std::runtime_error("node " + std::to_string(self) + " got no index: " + index_why);
    }
    map = wire ? build_index_from(io, wire->fd, wire->size, st, [](JobMap&) {})
               : build_index(io, st, [](JobMap&) {});
    placement = std::make_unique<Placement>(
        std::vector<Placement::Tier>{{64 << 20, 4096}}, [](int) { return uint64_t(1) << 30; }, 0);
    copier = std::make_unique<Copier>(map.map(), *placement,
                                      CopierOptions{.root_fd = root_fd,
                                                    .tier_fds = {tier_fd},
                                                    .block_sizes = {1 << 20},
                                                    .threads = 2,
                                                    .stage_ahead = false,
                                                    .fast_fs_check = false,
                                                    .peers = jw.get(),
                                                    .peer_threads = 2},
                                      counters);
    jw->serving(map.map(), *copier, {tier_fd});  // in the stager's order
    copier->start();
  }
  // As the stager stops: the job-wide cache first, then the copier.
  ~Node() {
    jw->stop();
    copier->stop();
    copier.reset();
    jw.reset();
    close(root_fd);
    close(tier_fd);
  }
};

class JobWideTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (other.name.empty()) {
      // Under contrib/check (MONARCH_STRICT=1), where there always is one, a failure.
      if (const char* strict = getenv("MONARCH_STRICT"); strict && std::string(strict) == "1")
        FAIL() << "no IPv4 address outside the loopback for node 1";
      GTEST_SKIP() << "no IPv4 address outside the loopback for node 1";
    }
    char name[] = "/tmp/monarch-jobwide-XXXXXX";
    dir = mkdtemp(name);
    root = dir / "ds";
    fs::create_directories(root);
    for (int i = 0; i < 8; ++i) {
      std::string bytes(kFileBytes, char('a' + i));
      std::ofstream(root / ("f" + std::to_string(i))) << bytes;
    }
    port = free_port();
    a = std::make_unique<Node>(root, dir / "tier-a", 0, job());
    b = start_b();
    for (uint32_t f = 0; f < a->map.map().size() && file < 0; ++f)
      if (a->jw->home(f) == 1) file = int(f);
    ASSERT_GE(file, 0) << "no file homed on node 1";
  }
  void TearDown() override {
    a.reset();
    b.reset();
    fs::remove_all(dir);
  }
  std::unique_ptr<Node> start_b() { return std::make_unique<Node>(root, dir / "tier-b", 1, job()); }
  Job job() const { return {.nodes = {"127.0.0.1", other.address}, .port = port}; }

  // Node 0 reads the file from node 1 as a copy of node 0 does, at most `ms`:
  // again while node 1 answers "pending" (its own copy from the PFS), and,
  // `patient`, while it is away too. The first other answer otherwise.
  Got fetch(long ms, bool patient = false) {
    std::vector<char> buf(kFileBytes);
    auto start = Clock::now();
    for (;;) {
      size_t n = 0;
      Got got = a->jw->read(1, uint32_t(file), 0, buf.data(), buf.size(), false, n);
      if (got == Got::kBytes) {
        EXPECT_EQ(n, kFileBytes);
        std::string want(kFileBytes, char('a' + (a->map.map().path(uint32_t(file)).back() - '0')));
        EXPECT_EQ(std::string(buf.data(), n), want) << "the bytes are not the file's";
        return got;
      }
      bool again = got == Got::kPending || (patient && got == Got::kUnavailable);
      if (!again || ms_since(start) > ms) return got;
      if (got != Got::kPending) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // The first answer for the file other than "pending" (a call to a node
  // that just went away may wait for its answer), within half the timeout.
  Got settled(bool replica) {
    std::vector<char> buf(kFileBytes);
    size_t n = 0;
    auto start = Clock::now();
    Got got;
    do got = a->jw->read(1, uint32_t(file), 0, buf.data(), buf.size(), replica, n);
    while (got == Got::kPending && ms_since(start) < long(kTimeoutMs) / 2);
    return got;
  }

  fs::path dir, root;
  uint16_t port = 0;
  std::unique_ptr<Node> a, b;
  int file = -1;
};

// A node whose stager stopped after it had answered (its epilog ran first,
// or it restarts) is not asked for a while, and its files come from the PFS
// meanwhile; it is given up on only if it stays away for the peer timeout.
TEST_F(JobWideTest, AStagerThatGoesAwayRestsItsNodeAndIsGivenUpOnlyAfterThePeerTimeout) {
  ASSERT_EQ(fetch(10000), Got::kBytes);

  b.reset();  // node 1's stager goes away
  EXPECT_EQ(settled(false), Got::kUnavailable) << "a copy reads the PFS while the node is away";
  EXPECT_TRUE(a->jw->resting(1));
  EXPECT_EQ(a->jw->home(uint32_t(file)), 1) << "given up on at once";
  EXPECT_EQ(a->counters[s_peers_failed].load(), 0u);

  // Back within the timeout (counted from the first call it did not answer): served again.
  b = start_b();
  EXPECT_EQ(fetch(kTimeoutMs / 2, true), Got::kBytes) << "not served again within the timeout";
  EXPECT_EQ(a->counters[s_peers_failed].load(), 0u);

  // Away for good: given up on once the peer timeout has passed, not before.
  b.reset();
  auto gone = Clock::now();
  long given_up_ms = -1;
  std::vector<char> buf(kFileBytes);
  size_t n = 0;
  while (ms_since(gone) < long(kTimeoutMs) * 4) {
    Got got = a->jw->read(1, uint32_t(file), 0, buf.data(), buf.size(), false, n);
    if (got == Got::kFailed) {
      given_up_ms = ms_since(gone);
      break;
    }
    EXPECT_NE(got, Got::kBytes);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(given_up_ms, 0) << "never given up on";
  EXPECT_GE(given_up_ms, long(kTimeoutMs) - 50) << "given up on before the peer timeout";
  EXPECT_EQ(a->counters[s_peers_failed].load(), 1u);
  EXPECT_NE(a->jw->home(uint32_t(file)), 1) << "its files are homed elsewhere";
}

// A replica (a copy made ahead from the file's home) never reads the PFS:
// while the home is away it waits for a later pass.
TEST_F(JobWideTest, AReplicaWaitsWhileTheHomeIsAway) {
  ASSERT_EQ(fetch(10000), Got::kBytes);
  b.reset();
  EXPECT_EQ(settled(true), Got::kNotYet);
  EXPECT_TRUE(a->jw->resting(1)) << "asked again at once";
  EXPECT_EQ(settled(true), Got::kNotYet);
  EXPECT_EQ(a->counters[s_peers_failed].load(), 0u);
}

// The first node's stager starts with the batch step, its replica passes
// find the other nodes not up until the job's first srun reaches them, maybe
// much later: that starts no clock for readers. A reader's copy asked once
// the node is up reads from it, never the PFS.
TEST_F(JobWideTest, ReplicasOfANodeNotUpYetLeaveItsReadersWaitAlone) {
  b.reset();  // node 1 never answered node 0
  auto start = Clock::now();
  while (ms_since(start) < long((JobWide::kNotUpWaitNs + 2 * JobWide::kNotUpRetryNs) / 1'000'000)) {
    if (!a->jw->resting(1)) {
      EXPECT_EQ(settled(true), Got::kNotYet);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  while (a->jw->resting(1)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(settled(true), Got::kNotYet);
  EXPECT_TRUE(a->jw->resting(1)) << "a replica pass asks a node not up again at once";
  b = start_b();
  EXPECT_EQ(fetch(10000), Got::kBytes) << "a reader's copy went to the PFS";
  EXPECT_EQ(a->counters[s_peers_failed].load(), 0u);
}

// What holds the job's port on its first node's address before the job's
// stager there starts.
enum class Stranger {
  kAnotherJob,  // another job's stager (another key): what it answers is refused
  kSilent,      // a socket that listens and never answers
  kBound,       // a socket bound, not listening: connections are refused
};

std::string to_string(Stranger s) {
  return s == Stranger::kAnotherJob ? "AnotherJob" : s == Stranger::kSilent ? "Silent" : "Bound";
}

// Nodes of one job that make their index as the stager does. UCX serves a
// listener only on an address of an interface (here 127.0.0.1 and the other
// address), so a job of three has its node 0 at 127.0.0.2, where only a
// stranger's plain socket can be; a job of two has both nodes reachable.
const std::vector<std::string> kThreeNodes = {"127.0.0.2", "127.0.0.1", other.address};
const std::vector<std::string> kTwoNodes = {"127.0.0.1", other.address};

class ElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (other.name.empty()) {
      if (const char* strict = getenv("MONARCH_STRICT"); strict && std::string(strict) == "1")
        FAIL() << "no IPv4 address outside the loopback";
      GTEST_SKIP() << "no IPv4 address outside the loopback";
    }
    char name[] = "/tmp/monarch-election-XXXXXX";
    dir = mkdtemp(name);
    root = dir / "ds";
    fs::create_directories(root);
    for (int i = 0; i < 8; ++i)
      std::ofstream(root / ("f" + std::to_string(i))) << std::string(kFileBytes, char('a' + i));
    job.port = free_port();
  }
  void TearDown() override {
    for (auto& n : nodes) n.reset();
    if (squatter >= 0) close(squatter);
    for (int fd : caller_dirs) close(fd);
    fs::remove_all(dir);
  }

  // Starts nodes `from`... at once, as the steps of one srun do, node 0 (when
  // among them) `late_ms` after the others; how long each took to have its map.
  void start(int from, long late_ms = 0) {
    std::vector<std::thread> threads;
    for (int i = from; i < int(job.nodes.size()); ++i)
      threads.emplace_back([this, i, late_ms] {
        if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(late_ms));
        auto t = Clock::now();
        try {
          nodes[i] = std::make_unique<Node>(root, dir / ("tier" + std::to_string(i)), i, job);
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
        took_ms[i] = ms_since(t);
      });
    for (auto& t : threads) t.join();
  }

  // The stranger takes node 0's address and port first.
  void squat(Stranger kind) {
    const std::string& address = job.nodes[0];
    if (kind == Stranger::kAnotherJob) {
      std::string error;
      another_job = peers::Peers::start(
          {.bind_address = address,
           .port = job.port,
           .key = "another-jobs-key",
           .identity = address},
          [](std::vector<char>, peers::Reply reply) { reply.send({'B'}); }, error);
      ASSERT_TRUE(another_job) << error;
      return;
    }
    squatter = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{.sin_family = AF_INET, .sin_port = htons(job.port)};
    inet_pton(AF_INET, address.c_str(), &a.sin_addr);
    ASSERT_EQ(bind(squatter, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
    if (kind == Stranger::kSilent) {
      ASSERT_EQ(listen(squatter, 64), 0);
    }
  }

  // A node of the job that only calls (UCX reaches no node at 127.0.0.2 and
  // up: see kThreeNodes), with a directory of its own for the index.
  std::unique_ptr<JobWide> caller(int self, std::atomic<uint64_t>* counters, std::string& error) {
    fs::path own = dir / ("caller" + std::to_string(self));
    fs::create_directories(own);
    caller_dirs.push_back(open(own.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    return JobWide::start({.nodes = job.nodes,
                           .self = self,
                           .port_low = job.port,
                           .port_high = job.port,
                           .address = job.nodes[size_t(self)],
                           .key = "job-77-secret",
                           .timeout_ms = job.timeout_ms,
                           .index_wait_ms = kIndexWaitMs,
                           .wire_dir = caller_dirs.back(),
                           .piece_bytes = job.piece_bytes},
                          counters, error);
  }

  // Node `a` and node `b` are one cache: the same file under every id, the
  // same homes (node 0 none), and each reads the files homed on the other
  // from it, with the right bytes.
  void one_cache(int a, int b) {
    JobMap& ma = nodes[a]->map.map();
    JobMap& mb = nodes[b]->map.map();
    ASSERT_EQ(ma.size(), 8u);
    ASSERT_EQ(ma.size(), mb.size());
    std::vector<char> buf(kFileBytes);
    for (uint32_t f = 0; f < ma.size(); ++f) {
      EXPECT_EQ(ma.path(f), mb.path(f)) << "file " << f;
      EXPECT_EQ(ma.entry(f).ino, mb.entry(f).ino) << "file " << f;
      int ha = nodes[a]->jw->home(f), hb = nodes[b]->jw->home(f);
      ha = ha < 0 ? a : ha;  // home() says -1 for the node itself
      hb = hb < 0 ? b : hb;
      EXPECT_EQ(ha, hb) << "file " << f << ": homes differ";
      if (ha != a && ha != b) continue;
      int reader = ha == a ? b : a;
      Got got;
      size_t n = 0;
      auto start = Clock::now();
      do got = nodes[reader]->jw->read(ha, f, 0, buf.data(), buf.size(), false, n);
      while (got == Got::kPending && ms_since(start) < 10000);
      ASSERT_EQ(got, Got::kBytes) << "node " << reader << " reading file " << f << " from " << ha;
      std::string want(kFileBytes, char('a' + (ma.path(f).back() - '0')));
      EXPECT_EQ(std::string(buf.data(), n), want) << "file " << f;
    }
  }

  fs::path dir, root;
  Job job{.elect = true};
  std::unique_ptr<Node> nodes[4];
  std::string errors[4];
  long took_ms[4] = {};
  std::unique_ptr<peers::Peers> another_job;
  int squatter = -1;
  std::vector<int> caller_dirs;
};

class SquatTest : public ElectionTest, public ::testing::WithParamInterface<Stranger> {};

// The first node's port is taken: its stager cannot listen (it caches alone,
// stager_main.cpp), and the job's other nodes give it up; node 1 walks the
// dataset for the job and node 2 gets the index from node 1: one walk, one
// cache. Another job's stager (its front door closes on this job's Proof,
// which a caller cannot tell from a handshake a flood evicted: never final),
// silence or refused connections put node 0 out after the patience. (Another
// job: two nodes, UCX reaches it only at an interface's address; else three,
// node 0 at 127.0.0.2.)
TEST_P(SquatTest, TheOtherNodesShareOneIndexWhenTheFirstNodesPortIsTaken) {
  job.nodes = GetParam() == Stranger::kAnotherJob ? kTwoNodes : kThreeNodes;
  job.timeout_ms = 1000;  // out after kIndexPatienceNs
  squat(GetParam());

  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  std::string error;
  EXPECT_FALSE(JobWide::start({.nodes = job.nodes,
                               .port_low = job.port,
                               .port_high = job.port,
                               .address = job.nodes[0],
                               .key = "job-77-secret"},
                              counters, error))
      << "node 0 listens on a port a stranger holds";
  EXPECT_NE(error.find("listening on " + job.nodes[0] + ":" + std::to_string(job.port)),
            std::string::npos)
      << error;

  start(1);
  for (size_t i = 1; i < job.nodes.size(); ++i) {
    ASSERT_TRUE(nodes[i]) << errors[i];
    EXPECT_EQ(nodes[i]->jw->walks(), i == 1) << "node " << i;
    EXPECT_EQ(nodes[i]->counters[s_index_received].load(), i == 1 ? 0u : 1u) << "node " << i;
    EXPECT_EQ(nodes[i]->counters[s_peers_failed].load(), 1u) << "node " << i << ": node 0 alone";
    for (uint32_t f = 0; f < nodes[i]->map.map().size(); ++f)
      EXPECT_NE(nodes[i]->jw->home(f), 0) << "file " << f << " homed on node 0";
  }
  long patience_ms = long(JobWide::kIndexPatienceNs / 1'000'000);
  EXPECT_GE(took_ms[1], patience_ms - 50) << "node 0 given up on before the patience";
  if (job.nodes.size() == 3) one_cache(1, 2);
}

// A first node a second and a half late (its step started last) is waited
// for: the other takes the index from it, and nobody is given up on.
TEST_F(ElectionTest, AFirstNodeThatIsLateIsWaitedFor) {
  job.nodes = kTwoNodes;
  job.timeout_ms = 1000;
  start(0, 1500);
  ASSERT_TRUE(nodes[0] && nodes[1]) << errors[0] << errors[1];
  EXPECT_TRUE(nodes[0]->jw->walks());
  EXPECT_FALSE(nodes[1]->jw->walks());
  EXPECT_EQ(nodes[1]->counters[s_index_received].load(), 1u);
  for (int i : {0, 1}) EXPECT_EQ(nodes[i]->counters[s_peers_failed].load(), 0u) << "node " << i;
  one_cache(0, 1);
}

// A node that received the index serves it as the walker does: node 2 gave
// node 0 up (not up yet when node 2 asked), then node 0 came up and node 1
// took the index from it; node 2 takes it from node 1. (Node 2 at 127.0.0.2
// is only a caller here.)
TEST_F(ElectionTest, ANodeThatReceivedTheIndexServesIt) {
  job.nodes = {"127.0.0.1", other.address, "127.0.0.2"};
  job.timeout_ms = 8000;  // the patience: room for nodes 0 and 1 to start
  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  std::string error, why;
  bool final = false;
  std::unique_ptr<JobWide> third = caller(2, counters, error);
  ASSERT_TRUE(third) << error;
  auto start = Clock::now();
  while (counters[s_peers_failed].load() == 0 && ms_since(start) < 60000) {
    ASSERT_FALSE(third->fetch_index(1, why, final)) << "an index from a node not up";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(counters[s_peers_failed].load(), 1u) << "node 0 never given up on: " << why;

  nodes[0] = std::make_unique<Node>(root, dir / "tier0", 0, job);
  nodes[1] = std::make_unique<Node>(root, dir / "tier1", 1, job);
  EXPECT_EQ(nodes[1]->counters[s_index_received].load(), 1u);
  EXPECT_EQ(nodes[1]->counters[s_peers_failed].load(), 0u);
  std::optional<IndexFile> wire = third->fetch_index(kIndexWaitMs, why, final);
  ASSERT_TRUE(wire) << why;
  EXPECT_FALSE(third->walks());
  EXPECT_EQ(counters[s_index_received].load(), 1u);
  EXPECT_EQ(counters[s_peers_failed].load(), 1u) << "node 1 given up on too";
  EXPECT_TRUE(contents(wire->fd, wire->size) == index_wire(nodes[0]->map.map()))
      << "not the index node 0 walked";
  third->stop();
}

// Nothing the job sends has a size limit a dataset can exceed: with answers
// of at most 4 KiB, an index of hundreds of KiB arrives whole, each node
// takes it from its parent in the tree (node 2 from node 0, node 3 from node
// 1, which relays what it received), and a file of 64 KiB comes in pieces.
TEST_F(ElectionTest, TheIndexAndFilesArriveWholeInPiecesDownTheTree) {
  for (int d = 0; d < 40; ++d) {
    fs::create_directories(root / ("d" + std::to_string(d)));
    for (int i = 0; i < 50; ++i)
      std::ofstream(root / ("d" + std::to_string(d)) /
                    ("file-with-a-long-name-" + std::to_string(i)))
          << i;
  }
  job.nodes = {"127.0.0.1", other.address, "127.0.0.2", "127.0.0.3"};
  job.piece_bytes = 4096;
  nodes[0] = std::make_unique<Node>(root, dir / "tier0", 0, job);
  nodes[1] = std::make_unique<Node>(root, dir / "tier1", 1, job);
  std::string walked = index_wire(nodes[0]->map.map());
  ASSERT_GT(walked.size(), 50 * job.piece_bytes);
  EXPECT_EQ(nodes[1]->counters[s_index_source].load(), 1u) << "node 1 took it from node 0";
  EXPECT_EQ(nodes[1]->counters[s_index_bytes_in].load(), walked.size());
  std::atomic<uint64_t> counters[2][kNumStagerCounters] = {};
  for (int self : {2, 3}) {
    std::string error, why;
    bool final = false;
    std::unique_ptr<JobWide> node = caller(self, counters[self - 2], error);
    ASSERT_TRUE(node) << error;
    std::optional<IndexFile> wire = node->fetch_index(kIndexWaitMs, why, final);
    ASSERT_TRUE(wire) << "node " << self << ": " << why;
    EXPECT_TRUE(contents(wire->fd, wire->size) == walked) << "node " << self;
    EXPECT_EQ(counters[self - 2][s_index_source].load(), uint64_t(JobWide::index_parent(self)) + 1)
        << "node " << self << " took the index from another node than its parent";
    EXPECT_EQ(counters[self - 2][s_index_bytes_in].load(), walked.size()) << "node " << self;
    node->stop();
  }
  // (A piece whose answer was lost is sent again.)
  EXPECT_GE(nodes[1]->counters[s_index_bytes_out].load(), walked.size()) << "node 1 relayed it";
  EXPECT_GE(nodes[0]->counters[s_index_bytes_out].load(), 2 * walked.size());

  // A file homed on node 1, read by node 0 in answers of at most a piece.
  JobMap& m = nodes[0]->map.map();
  int file = -1;
  for (uint32_t f = 0; f < m.size() && file < 0; ++f)
    if (nodes[0]->jw->home(f) == 1 && m.entry(f).size == kFileBytes) file = int(f);
  ASSERT_GE(file, 0) << "no file of 64 KiB homed on node 1";
  std::string got;
  std::vector<char> buf(kFileBytes);
  auto start = Clock::now();
  while (got.size() < kFileBytes && ms_since(start) < 10000) {
    size_t n = 0;
    Got g = nodes[0]->jw->read(1, uint32_t(file), got.size(), buf.data(), kFileBytes - got.size(),
                               false, n);
    if (g == Got::kPending) continue;
    ASSERT_EQ(g, Got::kBytes);
    ASSERT_LE(n, job.piece_bytes);
    got.append(buf.data(), n);
  }
  std::string name(m.path(uint32_t(file)));
  EXPECT_EQ(got, std::string(kFileBytes, char('a' + (name.back() - '0')))) << name;
}

// A relay that dies while a node receives the index from it: the node gives
// it up and takes the rest from the relay's parent, from where it was.
TEST_F(ElectionTest, ARelayThatDiesMidwayIsLeftAndTheRestComesFromItsParent) {
  for (int d = 0; d < 100; ++d) {
    fs::create_directories(root / ("d" + std::to_string(d)));
    for (int i = 0; i < 100; ++i)
      std::ofstream(root / ("d" + std::to_string(d)) / ("file-" + std::to_string(i))) << i;
  }
  job.nodes = {"127.0.0.1", other.address, "127.0.0.2", "127.0.0.3"};
  job.piece_bytes = 4096;
  job.timeout_ms = 1000;  // out after kIndexPatienceNs
  nodes[0] = std::make_unique<Node>(root, dir / "tier0", 0, job);
  nodes[1] = std::make_unique<Node>(root, dir / "tier1", 1, job);
  std::string walked = index_wire(nodes[0]->map.map());
  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  std::string error, why;
  bool final = false;
  std::unique_ptr<JobWide> node = caller(3, counters, error);
  ASSERT_TRUE(node) << error;
  // Some pieces from node 1 (its parent), not all of them (a loaded machine
  // may take longer than the 20 ms of a fetch before the first arrive).
  while (counters[s_index_bytes_in].load() == 0)
    ASSERT_FALSE(node->fetch_index(20, why, final)) << "the whole index in 20 ms";
  uint64_t midway = counters[s_index_bytes_in].load();
  ASSERT_LT(midway, walked.size()) << "the whole index before node 1 went away";
  EXPECT_EQ(counters[s_index_source].load(), 2u) << "not from node 1";
  nodes[1].reset();
  std::optional<IndexFile> wire = node->fetch_index(kIndexWaitMs, why, final);
  ASSERT_TRUE(wire) << why;
  EXPECT_TRUE(contents(wire->fd, wire->size) == walked);
  EXPECT_EQ(counters[s_index_source].load(), 1u) << "the rest not from node 0";
  EXPECT_EQ(counters[s_peers_failed].load(), 1u);
  EXPECT_EQ(counters[s_index_bytes_in].load(), walked.size()) << "received again from the start";
  EXPECT_FALSE(node->walks());
  node->stop();
}

// A relay whose index.wire lost its bytes (the user's own file on the first
// tier, truncated; or a read error of the tier) says it has no index to send:
// its children take it from its parent at once, instead of waiting for it
// until start_timeout and walking alone (found by review).
TEST_F(ElectionTest, ARelayWhoseIndexFileWasTruncatedIsLeftForItsParent) {
  job.nodes = {"127.0.0.1", other.address, "127.0.0.2", "127.0.0.3"};
  job.timeout_ms = 1000;
  nodes[0] = std::make_unique<Node>(root, dir / "tier0", 0, job);
  nodes[1] = std::make_unique<Node>(root, dir / "tier1", 1, job);
  ASSERT_EQ(nodes[1]->counters[s_index_received].load(), 1u);
  std::string walked = index_wire(nodes[0]->map.map());
  ASSERT_EQ(truncate((dir / "tier1" / kIndexWireName).c_str(), 0), 0) << strerror(errno);
  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  std::string error, why;
  bool final = false;
  std::unique_ptr<JobWide> node = caller(3, counters, error);
  ASSERT_TRUE(node) << error;
  std::optional<IndexFile> wire = node->fetch_index(kIndexWaitMs, why, final);
  ASSERT_TRUE(wire) << why;
  EXPECT_TRUE(contents(wire->fd, wire->size) == walked);
  EXPECT_EQ(counters[s_index_source].load(), 1u) << "not from node 0";
  EXPECT_EQ(counters[s_peers_failed].load(), 1u) << "node 1 not left";
  node->stop();
}

// The memory a process has held at most, and holds now (bytes), from
// /proc/PID/status.
uint64_t status_kib(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(strlen(field))) << 10;
  return 0;
}

// A walker asked for its index again and again, by callers that take every
// answer and by one that takes none, holds at most the answers its peers
// bound lets it hold: nothing it does grows with the asks or with the index
// (its wire form here is far larger than that bound).
TEST(JobWideMemory, AWalkerAskedAgainAndAgainHoldsBoundedMemory) {
  char name[] = "/tmp/monarch-walker-XXXXXX";
  fs::path dir = mkdtemp(name), root = dir / "ds";
  std::string tail(150, 'n');
  for (int d = 0; d < 50; ++d) {
    fs::create_directories(root / ("d" + std::to_string(d)));
    for (int i = 0; i < 2000; ++i)
      close(creat((root / ("d" + std::to_string(d)) / (tail + std::to_string(i))).c_str(), 0644));
  }
  constexpr uint64_t kPiece = 64 << 10, kAnswers = 4 << 20;
  uint16_t port = free_port();
  int in[2], out[2];
  ASSERT_EQ(pipe2(in, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(out, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  std::vector<std::string> args = {MONARCH_JOBWIDE_WALKER, root.string(),
                                   dir.string(),           std::to_string(port),
                                   std::to_string(kPiece), std::to_string(kAnswers)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, MONARCH_JOBWIDE_WALKER, &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(in[0]);
  close(out[1]);
  char line[64] = {};
  pollfd p{out[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 120000), 1) << "the walker never served";
  ASSERT_GT(read(out[0], line, sizeof line - 1), 0);
  ASSERT_EQ(std::string(line), "serving\n");

  std::string error;
  std::unique_ptr<peers::Peers> caller = peers::Peers::start(
      {.bind_address = "127.0.0.2",
       .key = "job-77-secret",
       .identity = "127.0.0.2",
       .hosts = {{"127.0.0.1", "127.0.0.1"}, {"127.0.0.2", "127.0.0.2"}}},
      [](std::vector<char>, peers::Reply) {}, error);
  ASSERT_TRUE(caller) << error;
  auto ask = [&](uint64_t off, size_t max_reply, std::vector<char>& reply) {
    JobWideRequest r{.type = JobWideRequest::kIndex, .off = off, .len = kPiece};
    return caller->call("127.0.0.1", port, {reinterpret_cast<char*>(&r), sizeof r}, reply, 5000,
                        max_reply);
  };
  std::vector<char> first;
  ASSERT_TRUE(ask(0, sizeof(IndexPiece) + kPiece + 1, first).ok());
  ASSERT_EQ(first.back(), 'B');
  IndexPiece head;
  std::memcpy(&head, first.data(), sizeof head);
  uint64_t total = head.total;
  ASSERT_GT(total, kAnswers + (8 << 20)) << "an index smaller than the bound shows nothing";

  // From the walker's memory now on, what the asks make it hold at most.
  ASSERT_TRUE(std::ofstream("/proc/" + std::to_string(pid) + "/clear_refs") << "5");
  uint64_t before = status_kib(pid, "VmRSS:");
  std::atomic<uint64_t> whole{0}, busy{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 5; ++t)
    threads.emplace_back([&, t] {
      std::vector<char> reply;
      for (uint64_t i = 0; i < 500; ++i) {
        uint64_t off = (i * 7919 + uint64_t(t) * 104729) * kPiece % total;
        // Caller 0 takes no answer: each is too long for it.
        peers::Status st = ask(off, t == 0 ? 1 : sizeof(IndexPiece) + kPiece + 1, reply);
        if (st.ok() && reply.back() == 'B') whole++;
        if (st.code == peers::Code::error) busy++;
      }
    });
  for (auto& t : threads) t.join();
  uint64_t grew = status_kib(pid, "VmHWM:") - before;
  printf("index %llu bytes; pieces taken whole %llu, errors %llu; the walker grew by %llu KiB\n",
         (unsigned long long)total, (unsigned long long)whole.load(),
         (unsigned long long)busy.load(), (unsigned long long)(grew >> 10));
  EXPECT_GT(whole.load(), 1000u) << "the callers that take answers got few";
  if (!kSanitized) {
    EXPECT_LE(grew, kAnswers + (8 << 20)) << "the walker's memory grew with the asks";
  }
  close(in[1]);  // the walker ends
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(out[0]);
  caller.reset();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Stranger, SquatTest,
                         ::testing::Values(Stranger::kAnotherJob, Stranger::kSilent,
                                           Stranger::kBound),
                         [](const auto& info) { return to_string(info.param); });

// The module the stager loads for a multi-node job (jobwide_load.h), itself:
// its entry refuses another build's ABI with an error that says so, and
// starts the cache for its own.
TEST(JobWideModule, RefusesAnotherBuildAndStartsForItsOwn) {
  void* module = dlopen(MONARCH_JOBWIDE_MODULE, RTLD_NOW | RTLD_LOCAL);
  ASSERT_TRUE(module) << dlerror();
  auto start =
      reinterpret_cast<decltype(&monarch_jobwide_start)>(dlsym(module, "monarch_jobwide_start"));
  ASSERT_TRUE(start) << dlerror();
  auto options = [] {
    uint16_t port = free_port();
    return JobWideOptions{.nodes = {"127.0.0.1"},
                          .port_low = port,
                          .port_high = port,
                          .address = "127.0.0.1",
                          .key = "job-78-secret-key"};
  };
  std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  std::string error;
  JobWideOptions o = options();
  EXPECT_EQ(start("0.0.1 1 2 3 4 5", &o, counters, &error), nullptr);
  EXPECT_NE(error.find("from another build of Monarch"), std::string::npos) << error;
  error.clear();
  o = options();
  std::unique_ptr<JobWide> jw(start(jobwide_abi().c_str(), &o, counters, &error));
  ASSERT_TRUE(jw) << error;
  EXPECT_TRUE(jw->walks());
  jw->stop();
}

}  // namespace
}  // namespace monarch
