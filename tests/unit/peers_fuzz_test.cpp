// Every message the peer service decodes, fed bytes from a seeded generator
// and mutations of valid messages: the request and answer headers, the
// front door's handshake, the port candidates, the sequence window, the job-wide request, the
// index's wire form. Deterministic (fixed seeds) and bounded (fixed iterations) for CI. Each
// decoder must return a verdict, accept only what its contract allows, and never allocate more than
// kMaxAllocation for any input.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <set>

#include "index_wire.h"
#include "jobwide.h"
#include "largest_allocation.h"
#include "peers.h"

namespace monarch {
namespace {
namespace fs = std::filesystem;
namespace wire = peers::wire;

constexpr size_t kMaxAllocation = 1 << 20;

std::string random_bytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = char(rng());
  return s;
}

// A valid message with a few bytes changed, or cut, or grown.
std::string mutate(std::mt19937_64& rng, std::string s) {
  switch (rng() % 4) {
    case 0:
      s.resize(rng() % (s.size() + 1));
      break;
    case 1:
      s += random_bytes(rng, 1 + rng() % 16);
      break;
    default:
      for (unsigned k = 1 + rng() % 4; k > 0 && !s.empty(); --k) s[rng() % s.size()] = char(rng());
  }
  return s;
}

template <typename T>
std::string bytes_of(const T& t) {
  return std::string(reinterpret_cast<const char*>(&t), sizeof t);
}

TEST(PeersFuzz, RequestAndAnswerHeaders) {
  std::mt19937_64 rng(23);
  wire::RequestHeader valid_request{wire::kMagic, 0, 3, 5, 9, {}};
  wire::AnswerHeader valid_answer{wire::kMagic, wire::kAnswerOk, 3, 5, {}};
  largest_allocation = 0;
  size_t accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string h = i % 2 == 0 ? bytes_of(valid_request) : bytes_of(valid_answer);
    if (rng() % 2)
      h = random_bytes(rng, rng() % 96);
    else if (rng() % 4)
      h = mutate(rng, h);
    size_t length = rng() % 3 == 0 ? rng() : rng() % 512;
    bool rndv = rng() % 4 == 0;
    wire::RequestHeader r;
    std::string why;
    if (wire::decode_request(h.data(), h.size(), length, rndv, r, why)) {
      ++accepted;
      EXPECT_EQ(h.size(), sizeof r);
      EXPECT_LE(length, wire::kMaxRequest);
      EXPECT_FALSE(rndv);
      EXPECT_EQ(r.magic, wire::kMagic);
      EXPECT_NE(r.seq, 0u);
    } else {
      EXPECT_FALSE(why.empty());
    }
    wire::AnswerHeader a;
    if (wire::decode_answer(h.data(), h.size(), a)) {
      EXPECT_EQ(h.size(), sizeof a);
      EXPECT_LE(a.answer, uint32_t(wire::kAnswerBusy));
    }
  }
  EXPECT_GT(accepted, 0u) << "the mutations never reached a valid request";
  EXPECT_LT(largest_allocation.load(), kMaxAllocation);
}

// The front door's three messages, as a stranger may send any of them to
// either side: a verdict for any bytes, the address length always within
// kMaxAddress, an identity only when zero-padded and not empty.
TEST(PeersFuzz, HandshakeMessages) {
  std::mt19937_64 rng(2323);
  wire::Hello valid_hello{wire::kMagic, 0, {1, 2, 3}};
  wire::Proof valid_proof{wire::kMagic, 40, {4, 5}, "node1", {}};
  wire::Welcome valid_welcome{wire::kMagic, 40, 77, {}};
  largest_allocation = 0;
  size_t hellos = 0, proofs = 0, welcomes = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string m = i % 3 == 0   ? bytes_of(valid_hello)
                    : i % 3 == 1 ? bytes_of(valid_proof)
                                 : bytes_of(valid_welcome);
    if (rng() % 2)
      m = random_bytes(rng, rng() % 160);
    else if (rng() % 4)
      m = mutate(rng, m);
    wire::Hello h;
    if (wire::decode_hello(m.data(), m.size(), h)) {
      ++hellos;
      EXPECT_EQ(m.size(), sizeof h);
      EXPECT_EQ(h.magic, wire::kMagic);
    }
    wire::Proof p;
    if (wire::decode_proof_head(m.data(), m.size(), p)) {
      ++proofs;
      EXPECT_GE(m.size(), sizeof p);
      EXPECT_GE(p.address_length, 1u);
      EXPECT_LE(p.address_length, wire::kMaxAddress);
      std::string_view identity;
      if (wire::proof_identity(p, identity)) {
        EXPECT_FALSE(identity.empty());
        EXPECT_LE(identity.size(), wire::kMaxIdentity);
        EXPECT_EQ(identity.find('\0'), std::string_view::npos);
        for (size_t k = identity.size(); k < wire::kMaxIdentity; ++k) EXPECT_EQ(p.identity[k], 0);
      }
    }
    wire::Welcome w;
    if (wire::decode_welcome_head(m.data(), m.size(), w)) {
      ++welcomes;
      EXPECT_GE(m.size(), sizeof w);
      EXPECT_NE(w.session, 0u);
      EXPECT_GE(w.address_length, 1u);
      EXPECT_LE(w.address_length, wire::kMaxAddress);
    }
  }
  EXPECT_GT(hellos, 0u);
  EXPECT_GT(proofs, 0u);
  EXPECT_GT(welcomes, 0u);
  EXPECT_LT(largest_allocation.load(), kMaxAllocation);
}

// The ports: within the range, at most kPortCandidates, distinct, the same
// for the same key, and spread over the range.
TEST(PeersFuzz, PortCandidates) {
  std::mt19937_64 rng(7400);
  std::set<uint16_t> firsts;
  for (int i = 0; i < 2000; ++i) {
    std::string key = random_bytes(rng, rng() % 40);
    uint16_t low = uint16_t(1024 + rng() % 60000);
    uint16_t high = uint16_t(std::min<uint32_t>(65535, low + rng() % 600));
    auto ports = wire::port_candidates(key, low, high);
    ASSERT_FALSE(ports.empty());
    EXPECT_LE(ports.size(), wire::kPortCandidates);
    EXPECT_EQ(std::set<uint16_t>(ports.begin(), ports.end()).size(), ports.size());
    for (uint16_t p : ports) {
      EXPECT_GE(p, low);
      EXPECT_LE(p, high);
    }
    EXPECT_EQ(ports, wire::port_candidates(key, low, high));
    firsts.insert(wire::port_candidates(key, 7400, 7899)[0]);
  }
  EXPECT_GT(firsts.size(), 400u) << "the first candidates do not spread over 7400-7899";
  EXPECT_TRUE(wire::port_candidates("k", 0, 0).empty());
  EXPECT_TRUE(wire::port_candidates("k", 9000, 8000).empty());
  EXPECT_EQ(wire::port_candidates("k", 9000, 9000), std::vector<uint16_t>{9000});
}

// No sequence number is ever taken twice, whatever the order they come in;
// a fresh one within the window always is.
TEST(PeersFuzz, SequenceWindowNeverTakesOneTwice) {
  std::mt19937_64 rng(64);
  for (int round = 0; round < 200; ++round) {
    wire::Window w;
    std::set<uint64_t> taken;
    uint64_t top = 0;
    for (int i = 0; i < 2000; ++i) {
      uint64_t seq = rng() % 8 == 0 ? rng() % (top + 200) : top + 1 + rng() % 3 - rng() % 80;
      if (rng() % 500 == 0) seq = rng();
      bool fresh = w.fresh(seq);
      if (taken.count(seq) || seq == 0) {
        EXPECT_FALSE(fresh) << seq;
      }
      if (seq > top) {
        EXPECT_TRUE(fresh) << seq;
      }
      if (seq != 0 && seq <= top && top - seq < 64 && !taken.count(seq)) {
        EXPECT_TRUE(fresh) << seq;
      }
      if (fresh) {
        w.take(seq);
        taken.insert(seq);
        top = std::max(top, seq);
      }
    }
  }
}

TEST(PeersFuzz, JobWideRequest) {
  std::mt19937_64 rng(56);
  JobWideRequest valid{.type = JobWideRequest::kFetch, .file = 3, .off = 4096, .len = 1 << 20};
  largest_allocation = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string b = rng() % 2 ? random_bytes(rng, rng() % 128) : mutate(rng, bytes_of(valid));
    JobWideRequest r;
    std::string why;
    if (decode_jobwide_request(b, r, why)) {
      EXPECT_EQ(b.size(), sizeof r);
      EXPECT_EQ(r.magic, JobWideRequest::kMagic);
      EXPECT_TRUE(r.type == JobWideRequest::kIndex || r.type == JobWideRequest::kFetch);
    } else {
      EXPECT_FALSE(why.empty());
    }
  }
  EXPECT_LT(largest_allocation.load(), kMaxAllocation);
}

// The index's wire form, damaged anywhere: build_index_from throws or builds
// a map that checks valid; it never crashes nor allocates beyond the bound.
TEST(PeersFuzz, IndexWireForm) {
  char name[] = "/tmp/monarch-fuzz-XXXXXX";
  fs::path dir = mkdtemp(name), root = dir / "ds";
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 20; ++i) {
      fs::path p = root / ("class" + std::to_string(c)) / ("f" + std::to_string(i));
      fs::create_directories(p.parent_path());
      std::ofstream(p) << std::string(c * 100 + i, 'x');
    }
  IndexOptions walked{.root = root.string(),
                      .out_path = (dir / "walked").string(),
                      .tier_dirs = {"/walker/t0"},
                      .generation = 1};
  IndexStats st;
  MappedMap map = build_index(walked, st, [](JobMap&) {});
  const std::string valid = index_wire(map.map());
  IndexOptions here{.root = root.string(),
                    .out_path = (dir / "here").string(),
                    .tier_dirs = {"/here/t0"},
                    .generation = 2};
  std::mt19937_64 rng(91);
  size_t built = 0, refused = 0;
  largest_allocation = 0;
  for (int i = 0; i < 1500; ++i) {
    std::string w = valid;
    if (rng() % 2) {  // the header, where the offsets and counts are
      for (unsigned k = 1 + rng() % 4; k > 0; --k) w[rng() % sizeof(Header)] = char(rng());
    } else {
      w = mutate(rng, w);
    }
    try {
      MappedMap got = build_index_from(here, w, st, [](JobMap& m) { ASSERT_TRUE(m.valid()); });
      EXPECT_TRUE(got.map().valid());
      ++built;
    } catch (const std::runtime_error&) {
      ++refused;
    }
  }
  printf("[ index wire ] 1500 damaged forms: %zu built (valid), %zu refused\n", built, refused);
  EXPECT_LT(largest_allocation.load(), kMaxAllocation);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace monarch
