// Every message one stager decodes from another (peers.h's wire namespace,
// jobwide.h's request), fed the input after its first byte, which picks the
// decoder. Each returns a verdict for any bytes, accepts only what its
// contract allows, and what it accepts is the bytes it was given (a
// fixed-size struct: decode(encode(x)) == x). The sequence window: a number
// is never taken twice, and a fresh one is taken.
#include <set>

#include "fuzz.h"
#include "jobwide.h"
#include "peers.h"

using namespace monarch;
namespace wire = monarch::peers::wire;

namespace {

template <typename T>
bool same_bytes(const T& t, std::string_view bytes) {
  return bytes.size() >= sizeof t && std::memcmp(&t, bytes.data(), sizeof t) == 0;
}

void request(fuzz::Input& in) {
  uint64_t length = in.take<uint64_t>();
  bool rndv = in.take<uint8_t>() & 1;
  std::string_view h = in.rest();
  wire::RequestHeader r;
  std::string why;
  if (wire::decode_request(h.data(), h.size(), length, rndv, r, why)) {
    FUZZ_CHECK(h.size() == sizeof r && same_bytes(r, h));
    FUZZ_CHECK(length <= wire::kMaxRequest && !rndv);
    FUZZ_CHECK(r.magic == wire::kMagic && r.seq != 0);
  } else {
    FUZZ_CHECK(!why.empty());
  }
}

void answer(std::string_view h) {
  wire::AnswerHeader a;
  if (wire::decode_answer(h.data(), h.size(), a)) {
    FUZZ_CHECK(h.size() == sizeof a && same_bytes(a, h));
    FUZZ_CHECK(a.magic == wire::kMagic && a.answer <= uint32_t(wire::kAnswerBusy));
  }
}

void hello(std::string_view m) {
  wire::Hello h;
  if (wire::decode_hello(m.data(), m.size(), h)) {
    FUZZ_CHECK(m.size() == sizeof h && same_bytes(h, m));
    FUZZ_CHECK(h.magic == wire::kMagic);
  }
}

void proof(std::string_view m) {
  wire::Proof p;
  if (!wire::decode_proof_head(m.data(), m.size(), p)) return;
  FUZZ_CHECK(same_bytes(p, m));
  FUZZ_CHECK(p.magic == wire::kMagic);
  FUZZ_CHECK(p.address_length >= 1 && p.address_length <= wire::kMaxAddress);
  std::string_view identity;
  if (wire::proof_identity(p, identity)) {
    FUZZ_CHECK(!identity.empty() && identity.size() <= wire::kMaxIdentity);
    FUZZ_CHECK(identity.data() == p.identity);
    FUZZ_CHECK(identity.find('\0') == std::string_view::npos);
    for (size_t k = identity.size(); k < wire::kMaxIdentity; ++k) FUZZ_CHECK(p.identity[k] == 0);
  }
}

void welcome(std::string_view m) {
  wire::Welcome w;
  if (!wire::decode_welcome_head(m.data(), m.size(), w)) return;
  FUZZ_CHECK(same_bytes(w, m));
  FUZZ_CHECK(w.magic == wire::kMagic && w.session != 0);
  FUZZ_CHECK(w.address_length >= 1 && w.address_length <= wire::kMaxAddress);
}

void jobwide_request(std::string_view b) {
  JobWideRequest r;
  std::string why;
  if (decode_jobwide_request(b, r, why)) {
    FUZZ_CHECK(b.size() == sizeof r && same_bytes(r, b));
    FUZZ_CHECK(r.magic == JobWideRequest::kMagic);
    FUZZ_CHECK(r.type == JobWideRequest::kIndex || r.type == JobWideRequest::kFetch);
  } else {
    FUZZ_CHECK(!why.empty());
  }
}

// Sequence numbers as a session receives them: each 8 bytes of the input,
// taken when fresh.
void window(fuzz::Input& in) {
  wire::Window w;
  std::set<uint64_t> taken;
  uint64_t top = 0;
  while (in.left()) {
    uint64_t seq = in.take<uint64_t>();
    bool fresh = w.fresh(seq);
    if (seq == 0 || taken.count(seq)) FUZZ_CHECK(!fresh);
    if (seq > top) FUZZ_CHECK(fresh);
    if (seq != 0 && seq <= top && top - seq < 64 && !taken.count(seq)) FUZZ_CHECK(fresh);
    if (fresh) {
      w.take(seq);
      taken.insert(seq);
      top = std::max(top, seq);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  switch (in.take<uint8_t>() % 7) {
    case 0:
      return request(in), 0;
    case 1:
      return answer(in.rest()), 0;
    case 2:
      return hello(in.rest()), 0;
    case 3:
      return proof(in.rest()), 0;
    case 4:
      return welcome(in.rest()), 0;
    case 5:
      return jobwide_request(in.rest()), 0;
    default:
      return window(in), 0;
  }
}
