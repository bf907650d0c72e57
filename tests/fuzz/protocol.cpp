// The datagrams of a job's processes to their stager (protocol.h): the first
// input byte says how the datagram came (cut by the kernel, how many
// descriptors, whether the stager serves peer reads), the rest is the
// datagram. decode_message acts only on a whole message of this map naming
// one of its files, with exactly the descriptors its type carries; what it
// accepts is the datagram's bytes, and a message it would act on, sent as
// its bytes, decodes to itself.
#include "protocol.h"
#include "fuzz.h"

using namespace monarch;

namespace {
// The job map the stager serves (the seeds are messages of it).
constexpr uint64_t kGeneration = 0x6d6f6e6172636821;
constexpr uint64_t kFiles = 1000;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  uint8_t how = in.take<uint8_t>();
  bool truncated = how & 1, peer_reads = how & 2;
  size_t fds = (how >> 2) & 3;
  std::string_view datagram = in.rest();
  Message m;
  if (decode_message(datagram.data(), datagram.size(), truncated, fds, kGeneration, kFiles,
                     peer_reads, m)) {
    FUZZ_CHECK(datagram.size() == sizeof m && !truncated);
    FUZZ_CHECK(std::memcmp(&m, datagram.data(), sizeof m) == 0);
    FUZZ_CHECK(m.magic == Message::kMessageMagic && m.generation == kGeneration);
    FUZZ_CHECK(m.file < kFiles);
    switch (m.type) {
      case Request::kData:
        FUZZ_CHECK(fds == 2);
        break;
      case Request::kPeerRead:
        FUZZ_CHECK(fds == 1 && peer_reads);
        break;
      case Request::kPlace:
      case Request::kStale:
      case Request::kRelease:
        FUZZ_CHECK(fds == 0);
        break;
      default:
        FUZZ_CHECK(!"a type the stager does not serve");
    }
  }
  // The datagram's first bytes as a message (zeros past its end), made valid
  // as a sender makes it, then sent: it decodes to itself.
  fuzz::Input fields(reinterpret_cast<const uint8_t*>(datagram.data()), datagram.size());
  Message sent = fields.take<Message>();
  sent.magic = Message::kMessageMagic;
  sent.generation = kGeneration;
  sent.file %= kFiles;
  const Request types[] = {Request::kPlace, Request::kData, Request::kStale, Request::kRelease,
                           Request::kPeerRead};
  sent.type = types[uint32_t(sent.type) % 5];
  size_t carried = sent.type == Request::kData ? 2 : sent.type == Request::kPeerRead ? 1 : 0;
  Message got;
  FUZZ_CHECK(decode_message(&sent, sizeof sent, false, carried, kGeneration, kFiles, true, got));
  FUZZ_CHECK(std::memcmp(&got, &sent, sizeof got) == 0);
  return 0;
}
