#include "jobwide.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "fd.h"
#include "resolve.h"

namespace monarch {
namespace {

using Request = JobWideRequest;
constexpr auto kIndex = Request::kIndex;
constexpr auto kFetch = Request::kFetch;
constexpr uint32_t kReplica = Request::kReplica;
// The last byte of every answer.
enum Answer : char {
  kBytes = 'B',        // the bytes asked for (or the index) precede it
  kPending = 'P',      // the copy is under way: ask again
  kUnavailable = 'U',  // this node will not have the file: read the PFS
  kNotYet = 'N',       // (a replica) this node has not copied it yet
};
// A server waits this long for a copy to reach the bytes asked for before it
// answers kPending: long enough to spare round trips, far within the timeout.
constexpr uint64_t kLongPollNs = 50'000'000;
constexpr unsigned kServers = 4;    // requests served at once (each may wait on a copy)
constexpr size_t kMaxQueued = 256;  // requests waiting for a server
// How long a reader's bytes from another node may stay pending (the node
// copies the file from the PFS first) before the reader reads the PFS.
constexpr uint64_t kPassOnPatienceNs = 30'000'000'000;
// A node asked for a piece of the index it does not hold yet answers
// "pending" once it has waited this long for it (the bytes it relays arrive
// meanwhile), and is asked again at once. Each call waits at most
// kIndexCallMs, and at least kIndexMinCallMs even when less of the fetch's
// time is left (a shorter call gives up on a piece already under way, which
// is then sent again); after a call that failed, the asking node waits 20 ms,
// doubled each time up to kIndexRetryMs.
constexpr uint64_t kIndexPollNs = 50'000'000;
constexpr uint64_t kIndexRetryMs = 100;
constexpr uint64_t kIndexCallMs = 1000;
constexpr uint64_t kIndexMinCallMs = 250;
// A wire form larger than this is no index (a map's file is far smaller).
constexpr uint64_t kMaxIndexBytes = uint64_t{1} << 44;

uint64_t now_ns() {
  return monotonic_ns();
}

}  // namespace

bool decode_jobwide_request(std::string_view bytes, JobWideRequest& out, std::string& why) {
  out = {};
  if (bytes.size() != sizeof out) {
    why = "a request of " + std::to_string(bytes.size()) + " bytes";
    return false;
  }
  std::memcpy(&out, bytes.data(), sizeof out);
  if (out.magic != JobWideRequest::kMagic) {
    why = "not a Monarch request";
    return false;
  }
  if (out.type != kIndex && out.type != kFetch) {
    why = "no such request";
    return false;
  }
  return true;
}

JobWide::JobWide(JobWideOptions options, std::atomic<uint64_t>* counters)
    : opt_(std::move(options)),
      homes_([&] {
        std::vector<Homes::Node> nodes;
        for (const std::string& n : opt_.nodes) nodes.push_back({n, 1.0});
        return nodes;
      }()),
      counters_(counters),
      peers_(new Peer[opt_.nodes.size()]),
      start_ns_(now_ns()) {
  walker_ = opt_.self == 0;
  opt_.piece_bytes = std::clamp<uint64_t>(opt_.piece_bytes, 1, kMaxPiece);
}

std::unique_ptr<JobWide> JobWide::start(JobWideOptions options,
                                        std::atomic<uint64_t>* stager_counters,
                                        std::string& error) {
  if (options.self < 0 || size_t(options.self) >= options.nodes.size()) {
    error = "this node is not in the job's node list";
    return nullptr;
  }
  std::unique_ptr<JobWide> jw;
  try {
    jw.reset(new JobWide(std::move(options), stager_counters));
  } catch (const std::invalid_argument& e) {
    error = e.what();
    return nullptr;
  }
  JobWide* self = jw.get();
  const JobWideOptions& o = jw->opt_;
  peers::Options po{.bind_address = o.address,
                    .port_low = o.port_low,
                    .port_high = o.port_high,
                    .key = o.key,
                    .identity = o.nodes[o.self],
                    .hosts = resolve_nodes(o.nodes, o.resolve_ms)};
  po.limits.answer_bytes = o.answer_bytes;
  po.limits.max_answer = size_t(o.piece_bytes) + 64;  // a piece and its header
  for (const std::string& node : o.nodes)
    if (!po.hosts.count(node))
      spdlog::warn(
          "node {} of the job: no IPv4 address within {} ms: it is neither called nor "
          "accepted",
          node, o.resolve_ms);
  // By default its own name's address; all of the node's when that is a
  // loopback one (Debian's /etc/hosts maps a host's own name to 127.0.1.1),
  // where no other node reaches it. Callers are checked by their address
  // either way (Options::hosts).
  if (po.bind_address.empty()) {
    auto own = po.hosts.find(o.nodes[o.self]);
    bool loopback = own != po.hosts.end() && own->second.rfind("127.", 0) == 0;
    po.bind_address = own != po.hosts.end() && !loopback ? own->second : "0.0.0.0";
    if (loopback)
      spdlog::info(
          "this node's name {} resolves to {} here, a loopback address: listening on all of "
          "its addresses",
          o.nodes[o.self], own->second);
  }
  jw->net_ = peers::Peers::start(
      std::move(po),
      [self](std::vector<char> request, peers::Reply reply) {
        self->handle(std::move(request), std::move(reply));
      },
      error);
  if (!jw->net_) return nullptr;
  for (unsigned i = 0; i < kServers; ++i) {
    jw->workers_.emplace_back([self] { self->worker(); });
    jw->workers_.emplace_back([self] { self->pass_on_worker(); });
  }
  return jw;
}

JobWide::~JobWide() {
  stop();
  net_.reset();
  if (held_.fd >= 0) close(held_.fd);
  EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(held_.sha));
}

void JobWide::stop() {
  closing_ = true;
  {
    std::lock_guard lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    cv_.notify_all();
  }
  for (auto& t : workers_) t.join();
  workers_.clear();
  if (index_writer_.joinable()) index_writer_.join();
  {
    std::lock_guard held(held_.mu);
    held_.cv.notify_all();
  }
  std::lock_guard lock(mu_);
  queue_.clear();  // their replies, dropped, answer the callers with an error
  for (const PassOn& p : pass_on_) close(p.fd);  // the readers read the PFS
  pass_on_.clear();
  map_ = nullptr;
  copier_ = nullptr;
}

void JobWide::serving(JobMap& map, Copier& copier, std::vector<int> tier_fds) {
  std::vector<uint64_t> sizes(map.size());
  for (uint32_t i = 0; i < map.size(); ++i) sizes[i] = map.entry(i).size;
  std::vector<uint16_t> first = balance_homes(sizes, int(opt_.nodes.size()));
  {
    std::lock_guard lock(mu_);
    first_home_ = std::move(first);
    map_ = &map;
    copier_ = &copier;
    tier_fds_ = std::move(tier_fds);
    cv_.notify_all();
  }
  bool walked;
  {
    std::lock_guard lock(held_.mu);
    walked = held_.total == 0 || held_.have < held_.total;
  }
  // Written by a thread of its own: the copies start meanwhile.
  if (walked) index_writer_ = std::thread([this, &map] { write_index(map); });
}

// The walker's index, written whole to its file as it is hashed, then
// served: one pass over the map, a chunk at a time.
void JobWide::write_index(const JobMap& map) {
  {
    // Whatever was held (a part of another node's index) is given up first:
    // a piece read from the file from now on is never sent.
    std::lock_guard lock(held_.mu);
    held_.total = held_.have = 0;
    held_.version++;
  }
  int fd = opt_.wire_dir >= 0 ? openat(opt_.wire_dir, kIndexWireName,
                                       O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)
                              : -1;
  bool ok = fd >= 0;
  int err = ok ? 0 : opt_.wire_dir >= 0 ? errno : EBADF;
  EVP_MD_CTX* sha = EVP_MD_CTX_new();
  ok = ok && sha && EVP_DigestInit_ex(sha, EVP_sha256(), nullptr) == 1;
  uint64_t total = 0;
  index_wire_chunks(map, [&](const char* p, size_t n) {
    if (closing_) ok = false, err = ECANCELED;
    if (ok && pwrite_full(fd, p, n, total) != n) ok = false, err = errno;
    ok = ok && EVP_DigestUpdate(sha, p, n) == 1;
    total += n;
  });
  unsigned char digest[32];
  unsigned len = 0;
  ok = ok && EVP_DigestFinal_ex(sha, digest, &len) == 1 && len == sizeof digest;
  EVP_MD_CTX_free(sha);
  std::lock_guard lock(held_.mu);
  if (held_.fd >= 0) close(held_.fd);
  held_.fd = ok ? fd : -1;
  if (!ok) {
    if (fd >= 0) close(fd);
    if (!closing_)
      spdlog::warn("cannot keep the index for the other nodes in {}: {}: they walk the dataset",
                   kIndexWireName, std::strerror(err));
    held_.unavailable = true;
  } else {
    held_.total = held_.have = total;
    std::memcpy(held_.digest, digest, sizeof digest);
    counters_[s_index_ms] = (now_ns() - start_ns_) / 1'000'000;
  }
  held_.version++;
  held_.cv.notify_all();
}

// On UCX's progress thread: queued for the servers, never served here.
void JobWide::handle(std::vector<char> request, peers::Reply reply) {
  std::lock_guard lock(mu_);
  if (stopping_) return;  // the reply, dropped, says so
  // Bounded: past it the caller asks again (its own deadline passes meanwhile).
  if (queue_.size() >= kMaxQueued) return reply.send({kPending});
  queue_.emplace_back(std::move(request), std::move(reply));
  cv_.notify_all();
}

void JobWide::worker() {
  for (;;) {
    std::pair<std::vector<char>, peers::Reply> item;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    Request r;
    std::string why;
    if (!decode_jobwide_request({item.first.data(), item.first.size()}, r, why)) {
      item.second.fail(why);
      continue;
    }
    serve(r, item.second);
  }
}

// A piece of the index, from the part this node holds: a node relays it
// while it receives it. Read from the file, never under mu_.
void JobWide::serve_index(const Request& r, peers::Reply& reply) {
  uint64_t deadline = now_ns() + kIndexPollNs;
  std::unique_lock lock(held_.mu);
  auto here = [&] { return held_.unavailable || (held_.total > 0 && held_.have > r.off); };
  while (!here() && !closing_ && now_ns() < deadline)
    held_.cv.wait_for(lock, std::chrono::nanoseconds(deadline - now_ns()));
  if (held_.unavailable) return reply.send({kUnavailable});  // it has none to send
  IndexPiece p{.total = held_.total, .have = held_.have, .off = r.off};
  std::memcpy(p.digest, held_.digest, sizeof p.digest);
  std::vector<char> out(sizeof p);
  if (!here() || closing_) {
    std::memcpy(out.data(), &p, sizeof p);
    out.push_back(kPending);
    return reply.send(std::move(out));
  }
  uint64_t len = std::min({r.len, held_.have - r.off, opt_.piece_bytes});
  uint64_t version = held_.version;
  int fd = held_.fd;
  lock.unlock();
  out.resize(sizeof p + len + 1);
  std::memcpy(out.data(), &p, sizeof p);
  size_t done = pread_full(fd, out.data() + sizeof p, len, r.off);
  lock.lock();
  // Given up for another index meanwhile (the file was rewritten): ask again.
  if (version != held_.version) {
    out.resize(sizeof p);
    out.push_back(kPending);
    return reply.send(std::move(out));
  }
  // The file lost bytes it had (edited, truncated, a read error): this node
  // holds no index to send, and says so, so that its askers ask another.
  if (done < len) {
    if (!held_.unavailable)
      spdlog::warn(
          "{} in the job directory cannot be read back at byte {}: the other nodes take "
          "the index from another node",
          kIndexWireName, r.off + done);
    held_.unavailable = true;
    held_.cv.notify_all();
    return reply.send({kUnavailable});
  }
  lock.unlock();
  out.back() = kBytes;
  counters_[s_index_bytes_out].fetch_add(len, std::memory_order_relaxed);
  reply.send(std::move(out));
}

void JobWide::serve(const Request& r, peers::Reply& reply) {
  spdlog::debug("peer request {} for file {} at {} ({} bytes)", r.type, r.file, r.off, r.len);
  if (r.type == kIndex) return serve_index(r, reply);
  uint64_t deadline = now_ns() + kLongPollNs;
  std::unique_lock lock(mu_);
  // Requests for a file that come before this node's map wait for it.
  while (!map_ && !stopping_ && now_ns() < deadline)
    cv_.wait_for(lock, std::chrono::milliseconds(20));
  if (!map_ || stopping_) return reply.send({kPending});
  JobMap& m = *map_;
  Copier& copier = *copier_;
  std::vector<int> tier_fds = tier_fds_;
  lock.unlock();
  if (r.type != kFetch || r.file >= m.size()) return reply.fail("no such request or file");
  const Entry& e = m.entry(r.file);
  if (e.size != r.size || e.ino != r.ino || e.mtime_ns != r.mtime_ns)
    return reply.send({kUnavailable});  // another version: never its bytes
  // At most a piece, whatever was asked: the caller asks again for the rest.
  uint64_t len = std::min(r.len, opt_.piece_bytes);
  uint64_t end = r.off < e.size ? r.off + std::min(len, e.size - r.off) : r.off;
  uint64_t want = end - r.off;
  bool placed = false;
  for (;;) {
    State s = m.state(r.file);
    char name[2 * kPathMax + 64];
    bool named = false;
    CopySlot* slot = nullptr;
    if (s.state == kCached && s.tier < tier_fds.size()) {
      named = copy_name(m, r.file, name, sizeof name);
      // Another node's reader: stage-ahead goes on as for one here. (A
      // replica is nobody's read yet.)
      if (!(r.flags & kReplica)) m.touch(r.file);
    } else if (s.state == kCopying && s.tier < tier_fds.size()) {
      slot = m.copy_slot(s.aux);
      // Never the file's last bytes from a copy under way: the home checks
      // its copy against the PFS only at the end, and a node that had them
      // all could finish a copy of a file the PFS changed meanwhile.
      if (slot && slot->file.load() == r.file + 1) {
        if (slot->progress.load() >= end && end < e.size)
          named = partial_name(m, r.file, name, sizeof name);
        else if (slot->stalled(now_ns(), opt_.stall_ns))
          return reply.send({kUnavailable});  // the copy here is stuck: the PFS
      }
    } else if (s.state == kNone) {
      if (r.flags & kReplica) return reply.send({kNotYet});  // not copied for a replica
      if (!copier.copies_on()) return reply.send({kUnavailable});
      if (!placed) copier.place(r.file), placed = true;
    } else if (s.state != kQueued && s.state != kClaimed) {
      return reply.send({kUnavailable});  // no room, failed, stale
    }
    if (named) {
      int fd = openat(tier_fds[s.tier], name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      std::vector<char> out(want + 1);
      ssize_t n = fd >= 0 ? pread(fd, out.data(), want, off_t(r.off)) : -1;
      if (fd >= 0) close(fd);
      // A partial copy must still be this file's, that far, after the read.
      bool good = n == ssize_t(want) &&
                  (!slot || (slot->file.load() == r.file + 1 && slot->progress.load() >= end) ||
                   m.state(r.file).state == kCached);
      if (good) {
        out[want] = kBytes;
        counters_[s_served_bytes].fetch_add(want, std::memory_order_relaxed);
        return reply.send(std::move(out));
      }
      // Published or reused meanwhile: look again.
    }
    if (now_ns() > deadline) return reply.send({kPending});
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int JobWide::index_source() const {
  for (int k = index_parent(opt_.self); k >= 0; k = index_parent(k))
    if (!peers_[k].failed.load()) return k;
  for (int k = 0; k < opt_.self; ++k)
    if (!peers_[k].failed.load()) return k;
  return -1;
}

// Takes the index `from` describes as the one to hold: this node's own so
// far, or another (two walkers), which is then received from its start.
// False when the index cannot be kept here.
bool JobWide::hold_index(const IndexPiece& from) {
  std::lock_guard lock(held_.mu);
  if (held_.total == from.total && std::memcmp(held_.digest, from.digest, sizeof from.digest) == 0)
    return true;
  if (held_.fd < 0 && opt_.wire_dir >= 0)
    held_.fd = openat(opt_.wire_dir, kIndexWireName,
                      O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  auto* sha = static_cast<EVP_MD_CTX*>(held_.sha);
  if (!sha) held_.sha = sha = EVP_MD_CTX_new();
  if (held_.fd < 0 || !sha || ftruncate(held_.fd, 0) != 0 ||
      EVP_DigestInit_ex(sha, EVP_sha256(), nullptr) != 1) {
    held_.unavailable = true;
    held_.cv.notify_all();
    return false;
  }
  held_.total = from.total;
  held_.have = 0;
  std::memcpy(held_.digest, from.digest, sizeof from.digest);
  held_.version++;
  held_.cv.notify_all();
  return true;
}

std::optional<IndexFile> JobWide::fetch_index(uint64_t wait_ms, std::string& why, bool& final,
                                              const std::atomic<bool>* stop) {
  std::vector<char> reply;
  uint64_t deadline = now_ns() + wait_ms * 1'000'000;
  uint64_t patience = std::max(uint64_t(opt_.timeout_ms) * 1'000'000, kIndexPatienceNs);
  uint64_t retry_ms = 20;
  final = true;
  for (;;) {
    int from = index_source();
    if (from < 0) {
      walker_ = true;
      why = "every node before this one in the job's node list is out";
      return std::nullopt;
    }
    const std::string& node = opt_.nodes[from];
    Peer& peer = peers_[from];
    uint64_t have;
    {
      std::lock_guard lock(held_.mu);
      if (held_.unavailable) {
        why = std::string("cannot keep the index here (") + kIndexWireName + " on the first tier)";
        return std::nullopt;
      }
      have = held_.have;
    }
    Request r{.type = kIndex, .off = have, .len = opt_.piece_bytes};
    std::string_view request(reinterpret_cast<char*>(&r), sizeof r);
    uint64_t left_ms = deadline > now_ns() ? (deadline - now_ns()) / 1'000'000 : 0;
    peers::Status st = net_->call(node, 0, request, reply,
                                  int(std::clamp<uint64_t>(left_ms, kIndexMinCallMs, kIndexCallMs)),
                                  sizeof(IndexPiece) + opt_.piece_bytes + 1);
    char answer = st.ok() && !reply.empty() ? reply.back() : 0;
    bool alive = st.ok() || st.code == peers::Code::error || st.code == peers::Code::busy;
    if (alive) {  // it holds the job's key
      peer.answered = true;
      peer.silent_since = 0;
    }
    IndexPiece p;
    bool piece = (answer == kBytes || answer == kPending) && reply.size() > sizeof p;
    if (piece) std::memcpy(&p, reply.data(), sizeof p);
    uint64_t n = piece ? reply.size() - sizeof p - 1 : 0;
    // What a node that holds the key says of its index is believed, but a
    // piece that is not one (another build's, a bug) leaves it out.
    bool sane = piece && p.off == r.off && p.have <= p.total && p.total <= kMaxIndexBytes &&
                n > 0 && n <= r.len && p.off + n <= p.have;
    if (answer == kBytes && sane) {
      if (!hold_index(p)) continue;  // says why at the top
      std::unique_lock lock(held_.mu);
      if (held_.have != p.off) continue;  // another index: from its start
      const char* bytes = reply.data() + sizeof p;
      bool ok = pwrite_full(held_.fd, bytes, n, p.off) == n;
      auto* sha = static_cast<EVP_MD_CTX*>(held_.sha);
      if (!ok || EVP_DigestUpdate(sha, bytes, n) != 1) {
        held_.unavailable = true;
        held_.cv.notify_all();
        continue;
      }
      held_.sole = held_.have == 0 || held_.sole == from ? from : -1;
      held_.have += n;
      held_.cv.notify_all();
      counters_[s_index_bytes_in].fetch_add(n, std::memory_order_relaxed);
      counters_[s_index_source] = uint64_t(from) + 1;
      retry_ms = 20;
      if (held_.have < held_.total) {
        if (now_ns() < deadline) continue;
        why = "the index was still arriving after " + std::to_string(wait_ms) + " ms (" +
              std::to_string(held_.have) + " of " + std::to_string(held_.total) + " bytes)";
        final = false;
        return std::nullopt;
      }
      unsigned char digest[32];
      unsigned len = 0;
      if (EVP_DigestFinal_ex(sha, digest, &len) == 1 && len == sizeof digest &&
          std::memcmp(digest, held_.digest, sizeof digest) == 0) {
        counters_[s_index_received] = 1;
        counters_[s_index_ms] = (now_ns() - start_ns_) / 1'000'000;
        return IndexFile{held_.fd, held_.total};
      }
      // Not the index its pieces said: received again from its start. The
      // node that sent it all is out; of pieces from several, none is
      // blamed (the next whole copy from one node tells).
      int sole = held_.sole;
      held_.total = held_.have = 0;
      held_.version++;
      lock.unlock();
      if (sole >= 0)
        fail(sole, {peers::Code::error, "the index it sent does not match its SHA-256"});
      continue;
    }
    if (answer == kPending) {
      // Alive, without that piece yet (walking, or receiving it itself), or
      // too busy to look (a bare "pending").
    } else if (st.ok()) {  // its own signed word: it has no index to send
      fail(from, {peers::Code::error, answer == kUnavailable ? "it has no index to send"
                                                             : "it sent no piece of the index"});
      continue;
    } else if (!alive) {  // not listening, or silent: out once that lasts
      uint64_t now = now_ns(), since = peer.silent_since.load();
      if (!since)
        peer.silent_since.compare_exchange_strong(since, now), since = since ? since : now;
      if (now - since >= patience) {
        fail(from, st);
        continue;
      }
    }
    if (stop && stop->load()) {  // the job ended meanwhile
      why = "stopped before " + node + " sent the index";
      return std::nullopt;
    }
    if (now_ns() >= deadline) {
      why = node + " sent no index within " + std::to_string(wait_ms) + " ms (" +
            (st.ok() ? std::string("it has none yet") : st.text) + ")";
      final = false;
      return std::nullopt;
    }
    if (answer != kPending || !piece) {  // the server waited already when it says how far it is
      std::this_thread::sleep_for(std::chrono::milliseconds(retry_ms));
      retry_ms = std::min(retry_ms * 2, kIndexRetryMs);
    }
  }
}

void JobWide::pass_on(uint32_t file, uint64_t off, uint64_t len, int fd) {
  std::lock_guard lock(mu_);
  if (stopping_) return void(close(fd));
  pass_on_.push_back({file, off, len, fd});
  cv_.notify_all();
}

void JobWide::pass_on_worker() {
  for (;;) {
    PassOn p;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !pass_on_.empty(); });
      if (stopping_) return;
      p = pass_on_.front();
      pass_on_.pop_front();
    }
    answer(p);
    close(p.fd);
  }
}

void JobWide::answer(const PassOn& p) {
  // A reader that stops reading holds a server at most this long.
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  setsockopt(p.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  auto send_all = [&](const void* data, size_t n) {
    for (size_t done = 0; done < n;) {
      ssize_t w = send(p.fd, static_cast<const char*>(data) + done, n - done, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      done += size_t(w);
    }
    return true;
  };
  JobMap* m;
  {
    std::lock_guard lock(mu_);
    m = map_;
  }
  int node = m && p.file < m->size() ? home(p.file) : -1;
  uint64_t size = node >= 0 ? m->entry(p.file).size : 0;
  int64_t n = node < 0 ? -1 : int64_t(p.off < size ? std::min(p.len, size - p.off) : 0);
  if (n < 0) spdlog::debug("a reader's read of file {} passed on to nobody: homed here", p.file);
  if (!send_all(&n, sizeof n) || n <= 0) return;
  // In blocks, each the whole way (the peer answers a block at most), so
  // that the reader gets every byte it asked for, as from a file.
  constexpr uint64_t kBlock = kMaxPiece;
  std::vector<char> buf(std::min<uint64_t>(uint64_t(n), kBlock));
  uint64_t start = now_ns();
  for (uint64_t done = 0; done < uint64_t(n);) {
    size_t want = size_t(std::min<uint64_t>(uint64_t(n) - done, kBlock)), got = 0;
    Got g = read(node, p.file, p.off + done, buf.data(), want, false, got);
    if (g == Got::kPending && now_ns() - start < kPassOnPatienceNs && !closing_) continue;
    if (g != Got::kBytes || got == 0) {  // an early end: the reader reads the PFS
      spdlog::debug("a reader's read of file {} at {}: node {} answered {}", p.file, p.off + done,
                    node, int(g));
      return;
    }
    counters_[s_peer_bytes].fetch_add(got, std::memory_order_relaxed);
    if (!send_all(buf.data(), got)) return;
    done += got;
  }
}

int JobWide::home(uint32_t file) {
  JobMap* m;
  {
    std::lock_guard lock(mu_);
    m = map_;
  }
  if (!m || file >= m->size() || file >= first_home_.size()) return -1;
  int h = first_home_[file];
  if (peers_[h].failed.load())  // re-homed: only a failed node's files move
    h = homes_.home(m->path(file), [this](int n) { return peers_[n].failed.load(); });
  return h == opt_.self || h < 0 ? -1 : h;
}

void JobWide::fail(int node, const peers::Status& why) {
  if (peers_[node].failed.exchange(true)) return;
  counters_[s_peers_failed].fetch_add(1);
  spdlog::warn("node {} of the job failed ({}: {}): its files come from the PFS or other nodes",
               opt_.nodes[node], peers::to_string(why.code), why.text);
}

bool JobWide::resting(int node) {
  if (node < 0 || size_t(node) >= opt_.nodes.size()) return false;
  uint64_t now = now_ns();
  return peers_[node].down_until.load() > now || peers_[node].replicas_after.load() > now;
}

bool JobWide::all_resting() {
  for (int n = 0; n < int(opt_.nodes.size()); ++n)
    if (n != opt_.self && !peers_[n].failed.load() && !resting(n)) return false;
  return true;
}

PeerSource::Got JobWide::read(int node, uint32_t file, uint64_t off, char* buf, size_t len,
                              bool replica, size_t& n) {
  n = 0;
  if (closing_) return Got::kUnavailable;
  if (node < 0 || size_t(node) >= opt_.nodes.size() || peers_[node].failed.load())
    return Got::kFailed;
  JobMap* m;
  {
    std::lock_guard lock(mu_);
    m = map_;
  }
  if (!m || file >= m->size()) return Got::kUnavailable;
  Peer& peer = peers_[node];
  // Not up yet, or its connection broke: its files come from the PFS
  // meanwhile (a replica waits).
  Got later = replica ? Got::kNotYet : Got::kUnavailable;
  if (replica ? resting(node) : peer.down_until.load() > now_ns()) return later;
  const Entry& e = m->entry(file);
  Request r{.type = kFetch,
            .file = file,
            .flags = replica ? kReplica : 0u,
            .off = off,
            .len = len,
            .size = e.size,
            .ino = e.ino,
            .mtime_ns = e.mtime_ns};
  thread_local std::vector<char> reply;
  // Short calls, so that the copy shows it is alive (the caller stamps its
  // progress between them) while a busy node answers late; a node silent
  // for the whole peer timeout is given up on.
  uint64_t call_ms = std::clamp<uint64_t>(opt_.stall_ns / 2'000'000, 20, opt_.timeout_ms);
  peers::Status st =
      net_->call(opt_.nodes[node], 0, std::string_view(reinterpret_cast<char*>(&r), sizeof r),
                 reply, int(call_ms), std::min<uint64_t>(len, kMaxPiece) + 1);
  std::atomic<uint64_t>& silent = peer.silent_since;
  if (st.code == peers::Code::unreachable && !peer.answered.load()) {
    // Never answered: its stager is not up yet (the job's steps reach nodes
    // one after the other), not dead. Given up on only if it never comes up.
    // A replica, which nobody waits for, asks again later and starts no
    // clock: the first node's stager starts with the batch step, maybe long
    // before the job's first srun reaches the others, and the wait below is
    // for a reader's copy, from a reader's first try.
    uint64_t now = now_ns();
    if (replica) {
      peer.replicas_after.store(now + kNotUpRetryNs);
      return Got::kNotYet;
    }
    uint64_t first = peer.first_try.load();
    if (!first) peer.first_try.compare_exchange_strong(first, now), first = first ? first : now;
    if (now - first < kNotUpWaitNs) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return replica ? Got::kNotYet : Got::kPending;
    }
    if (now - first < uint64_t(opt_.index_wait_ms) * 1'000'000) {
      peer.down_until.store(now + kNotUpRetryNs);
      return later;
    }
  }
  // Silent, or its connection broke after it had answered (a stager that
  // stopped at the job's end before this one, a loaded node, or a dead one):
  // given up on only when that lasts the whole peer timeout. A copy waits for
  // a silent node, which may answer any moment; a broken connection is tried
  // again later, and the copy reads the PFS meanwhile (a replica waits).
  // `refused` is a stranger's word (a squatter on the port, a forged answer):
  // as a broken connection, never a verdict at once.
  bool broken = (st.code == peers::Code::unreachable && peer.answered.load()) ||
                st.code == peers::Code::refused;
  if (st.code == peers::Code::timeout || broken) {
    uint64_t now = now_ns(), since = silent.load();
    if (!since) silent.compare_exchange_strong(since, now), since = since ? since : now;
    uint64_t timeout = uint64_t(opt_.timeout_ms) * 1'000'000;
    if (now - since < timeout) {
      if (!broken) return Got::kPending;
      // Asked again within the timeout, more than once, before given up on.
      peer.down_until.store(now + std::min(kNotUpRetryNs, timeout / 4));
      return later;
    }
    fail(node, st);
    return Got::kFailed;
  }
  silent.store(0);
  if (st.ok() || st.code == peers::Code::busy) peer.answered.store(true);
  if (st.code == peers::Code::busy) {  // alive, holding all the answers it may: asked again
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return replica ? Got::kNotYet : Got::kPending;
  }
  if (!st.ok()) {
    if (st.code == peers::Code::error) return Got::kUnavailable;  // that request, not the node
    fail(node, st);
    return Got::kFailed;
  }
  if (reply.empty()) return Got::kUnavailable;
  char answer = reply.back();
  if (answer == kPending) return Got::kPending;
  if (answer == kNotYet) return Got::kNotYet;
  if (answer != kBytes || reply.size() - 1 > len) return Got::kUnavailable;
  n = reply.size() - 1;
  std::memcpy(buf, reply.data(), n);
  return Got::kBytes;
}

}  // namespace monarch
