// Job-wide caching (issue 9): the stagers of a multi-node job as one cache.
//
// - One index per job, walked once: node k of the job's node list (Slurm's
//   order) walks the dataset when every node before it is out in its view
//   (node 0 always walks). Every other node fetches the index's wire form
//   (index_wire.h) by offset, in pieces of at most piece_bytes, into a file
//   of its job directory, and serves what it holds of it to others as it
//   arrives: the index is relayed down a tree of fan-out kIndexFanout over
//   the node list (node k asks its parent (k-1)/kIndexFanout; past a parent
//   that is out, its ancestors, then the other nodes before it, in order).
//   The time until every node holds it grows with the tree's depth, each
//   node sends it at most kIndexFanout times (plus to nodes whose own
//   sources are out), and no answer is larger than a piece, whatever the
//   dataset. Each piece carries the index's total size and SHA-256, which
//   the walker computes as it writes the wire form: a receiver checks the
//   whole against it, and starts again from a source whose index is
//   another (two walkers). A node is out
//   for the rest of the job (failed, as below) at once only when it says,
//   signed with the key, that it has no index to send; else when it answers
//   nothing signed for max(peer timeout, kIndexPatienceNs) from the first
//   try (its port taken by a squatter or another job, nobody listening, or
//   what listens never answering; a node whose stager cannot listen caches
//   alone): a refusal or a closed connection is never final, as a stranger
//   who reads and writes the network can fake either. A
//   node waits at most index_wait_ms in all, and past it walks and caches
//   alone (one log line).
//   Views of which nodes are out may differ (node 0 squatted, node 2 gave
//   node 1 up while node 1 was merely late: both walk, and node 1 asks node
//   2 for files by its own index): bytes stay right, as every request carries the file's
//   id, size, inode and mtime, and a node that holds another file or version
//   under that id answers "unavailable" and the asker reads the PFS. What is
//   lost is only PFS load: a second walk and copies of the files the two
//   indexes disagree on.
// - Homes (home.h): every file has one home node (balanced by bytes over the
//   job's one index; a failed node's files re-homed by rendezvous), which
//   copies it from the PFS and stages it ahead; another node that needs it copies it from the
//   home's tier (Copier's peer threads) into its own, tiers filled top-down
//   as ever: the node's hot set becomes local, and each file leaves the PFS
//   once per job.
// - Serving: a node asked for a file serves it from its copy (finished, or
//   the part written so far), and copies it from the PFS first when it has
//   none, whether or not it is the file's home in its own view: views of
//   failed nodes may differ between nodes, answers never do.
// - Faults: a peer that does not answer signed with the key (or cannot be
//   reached again, once it has answered) for the whole peer timeout, is
//   failed for the rest of the job: its files are re-homed (the next node by
//   rendezvous score, this one included) and nothing waits on it again. A
//   file the peer cannot serve is read from the PFS. Bytes come only from a
//   peer that knows the job's secret key.
//
// Only the stager loads this, from its own module (libmonarch_jobwide.so,
// which links UCX and libcrypto), and only for a multi-node job:
// jobwide_load.h. A single-node stager starts without those libraries.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "copier.h"
#include "home.h"
#include "index_wire.h"
#include "jobmap.h"
#include "peers.h"

namespace monarch {

// The most a node answers to one request, whatever it was asked: a piece
// of a file or of the index.
inline constexpr uint64_t kMaxPiece = 4 << 20;

struct JobWideOptions {
  std::vector<std::string> nodes;  // the job's nodes, in Slurm's order
  int self = 0;                    // this node's place in `nodes`
  // The configured range (peer_ports): every stager of the job listens on
  // the first free of the key's candidates in it (peers::wire::port_candidates).
  uint16_t port_low = 0, port_high = 0;
  // The address it listens on; empty: this node's name resolved (all of the
  // node's addresses, 0.0.0.0, when it does not resolve).
  std::string address;
  std::string key;                 // the job's secret
  unsigned timeout_ms = 1000;      // a peer silent this long is failed
  unsigned index_wait_ms = 30000;  // how long a node waits for the index before walking
  uint64_t stall_ns = 200'000'000;
  // How long the job's node names may take to resolve, all at once, at the
  // start: a name not resolved by then is neither called nor accepted.
  unsigned resolve_ms = 5000;
  // The directory (the job's, on the first tier; not owned) where the index's
  // wire form is kept, as kIndexWireName, to be served to the other nodes.
  int wire_dir = -1;
  uint64_t piece_bytes = kMaxPiece;  // the most one answer carries (of a file or of the index)
  uint64_t answer_bytes = 64 << 20;  // answers held at once (peers::Limits::answer_bytes)
};

// The index held by a node, whole: its wire form in a file (owned by the
// JobWide that fetched it), and its size.
struct IndexFile {
  int fd = -1;
  uint64_t size = 0;
};

// A request between the stagers of a job: the file named by its id in the
// job's one index, and its version, so that a node never serves another
// version's bytes. Exactly this size on the wire.
struct JobWideRequest {
  static constexpr uint32_t kMagic = 0x324a4e4d;  // "MNJ2"
  enum Type : uint32_t { kIndex = 1, kFetch = 2 };
  static constexpr uint32_t kReplica = 1;  // flags: see PeerSource::read
  uint32_t magic = kMagic;
  uint32_t type = 0;
  uint32_t file = 0;
  uint32_t flags = 0;
  uint64_t off = 0, len = 0, size = 0, ino = 0;  // kIndex: off and len of the wire form
  int64_t mtime_ns = 0;
};
// What precedes a piece of the index (and an answer "pending" to a request
// for one): the index this node holds, as far as it holds it.
struct IndexPiece {
  uint64_t total = 0;             // its wire form's size; 0: this node holds none yet
  uint64_t have = 0;              // the bytes of it this node holds, from the start
  uint64_t off = 0;               // where the bytes that follow begin
  unsigned char digest[32] = {};  // SHA-256 of the whole wire form
};
static_assert(kMaxPiece + sizeof(IndexPiece) + 1 <= peers::kMaxAnswer,
              "a piece and its header fit an answer");
// Pure: any bytes in; false and why when they are not a request.
bool decode_jobwide_request(std::string_view bytes, JobWideRequest& out, std::string& why);

class JobWide : public PeerSource {
 public:
  // Listens on the job's port. Null with `error` when it cannot (the port is
  // taken, UCX cannot start): the node then caches on its own.
  static std::unique_ptr<JobWide> start(JobWideOptions options,
                                        std::atomic<uint64_t>* stager_counters, std::string& error);
  ~JobWide() override;

  // What the stager calls is inline or virtual: it calls the module's code
  // through the object the module made, and links none of it.
  // This node walks the dataset for the job: it is node 0, or fetch_index()
  // found every node before it out.
  bool walks() const { return walker_.load(); }
  // The index, fetched from this node's sources (the tree, as above) until
  // it is held whole, waiting at most wait_ms (later calls go on where this
  // one ended); nullopt and why when it did not come. final: asking again is
  // pointless (walks() became true, the index cannot be kept here, or `stop`
  // was set); otherwise the time was too short.
  virtual std::optional<IndexFile> fetch_index(uint64_t wait_ms, std::string& why, bool& final,
                                               const std::atomic<bool>* stop = nullptr);
  // The map is published here: serving starts (the index, walked here or
  // received; files). Before that, requests wait.
  virtual void serving(JobMap& map, Copier& copier, std::vector<int> tier_fds);
  // Before the map, its copier or the tier descriptors go away: serving
  // stops, and read() fails at once from then on (the copier's threads may
  // still call it until it stops). The transport goes with the object.
  virtual void stop();

  // A reader of this node wants [off, off + len) of `file`, for which this
  // node has no room (Request::kPeerRead): the bytes are fetched from the
  // file's home and written to `fd` (taken), after their count; -1 when they
  // cannot be (the reader then reads the PFS). Never blocks the caller.
  virtual void pass_on(uint32_t file, uint64_t off, uint64_t len, int fd);

  int home(uint32_t file) override;
  Got read(int node, uint32_t file, uint64_t off, char* buf, size_t len, bool replica,
           size_t& n) override;
  bool resting(int node) override;

  // A node before this one that answers nothing for this long (or the peer
  // timeout, if longer) is out for the index. A live stager answers an index
  // request at once (pending until it has the index), and the steps of one
  // srun start on all nodes within about a second: twice the wait for a
  // file's home (kNotUpWaitNs), as giving up a node that is merely late
  // costs a second walk and the copies the two indexes disagree on, while
  // waiting costs only this node's reads going to the PFS a little longer.
  static constexpr uint64_t kIndexPatienceNs = 4'000'000'000;
  // A node that does not listen yet: its files are waited for this long from
  // a reader's copy's first try (the steps of one srun start on all nodes
  // within about a second), then read from the PFS, the node asked again
  // only every kNotUpRetryNs, and given up on once index_wait_ms have passed.
  static constexpr uint64_t kNotUpWaitNs = 2'000'000'000;
  static constexpr uint64_t kNotUpRetryNs = 1'000'000'000;
  static constexpr int kIndexFanout = 2;
  // The node this one asks for the index first: its parent in the tree.
  static int index_parent(int node) { return node > 0 ? (node - 1) / kIndexFanout : -1; }

 private:
  using Request = JobWideRequest;
  JobWide(JobWideOptions options, std::atomic<uint64_t>* counters);
  void handle(std::vector<char> request, peers::Reply reply);
  void worker();
  void serve(const Request& r, peers::Reply& reply);
  void serve_index(const Request& r, peers::Reply& reply);
  int index_source() const;
  void write_index(const JobMap& map);
  bool hold_index(const IndexPiece& from);
  void fail(int node, const peers::Status& why);
  struct PassOn {
    uint32_t file;
    uint64_t off, len;
    int fd;
  };
  void pass_on_worker();
  void answer(const PassOn& p);

  JobWideOptions opt_;
  Homes homes_;
  std::atomic<uint64_t>* counters_;
  std::unique_ptr<peers::Peers> net_;
  // What this node knows of each other node: given up on; since when it has
  // answered no call (0: it answers); whether it ever answered; until when
  // it is not asked (its stager starts with the job's first step there, or
  // its connection broke), and not asked for replicas; when a reader's copy
  // first tried it.
  struct Peer {
    std::atomic<bool> failed{false}, answered{false};
    std::atomic<uint64_t> silent_since{0}, down_until{0}, replicas_after{0}, first_try{0};
  };
  std::unique_ptr<Peer[]> peers_;
  std::atomic<bool> walker_{false};  // walks(): set once, never cleared

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::vector<char>, peers::Reply>> queue_;
  std::deque<PassOn> pass_on_;
  bool stopping_ = false;
  std::atomic<bool> closing_{false};  // stop() has begun: no call leaves this node
  JobMap* map_ = nullptr;             // set by serving()
  std::vector<uint16_t> first_home_;  // balance_homes() of the index, by serving()
  Copier* copier_ = nullptr;
  std::vector<int> tier_fds_;
  // The index this node holds, whole or the part received so far, in its
  // wire form: served to the nodes that ask as far as `have` reaches. When
  // it is given up for another (a source whose index is another), `version`
  // changes: a piece read meanwhile is not sent.
  struct Held {
    std::mutex mu;
    std::condition_variable cv;
    int fd = -1;  // kIndexWireName in wire_dir
    uint64_t total = 0, have = 0, version = 0;
    unsigned char digest[32] = {};
    bool unavailable = false;  // it cannot be kept or read back here: askers are told so
    int sole = -1;             // the node that sent every piece held, if one did
    void* sha = nullptr;       // the receiver's running SHA-256 (EVP_MD_CTX)
  } held_;
  uint64_t start_ns_ = 0;
  std::thread index_writer_;  // the walker's: writes the index's file (serving())
  std::vector<std::thread> workers_;
};

// What the stager and the module must agree on before the module's code runs
// on the stager's objects (its Copier, its map, its counters): the release
// and the sizes of the types they share. A module from another build (a node
// upgraded while a stager starts, a stager copied out of its build tree) is
// refused, and the node caches on its own.
inline std::string jobwide_abi() {
  return std::string(MONARCH_VERSION) + " " + std::to_string(sizeof(JobWide)) + " " +
         std::to_string(sizeof(JobWideOptions)) + " " + std::to_string(sizeof(Copier)) + " " +
         std::to_string(sizeof(CopierOptions)) + " " + std::to_string(sizeof(JobMap));
}

// The module's one entry: JobWide::start when `abi` is the module's own
// jobwide_abi(), with no exception leaving it.
extern "C" __attribute__((visibility("default"))) JobWide* monarch_jobwide_start(
    const char* abi, JobWideOptions* options, std::atomic<uint64_t>* stager_counters,
    std::string* error) noexcept;

}  // namespace monarch
