// The index another node of the job sends (index_wire.h): the input is a
// wire form in map_form.h's form (the live part of its header is zero on the
// wire). Its root and root inode are set to this process's dataset, as a
// wire form for this node's dataset has them: the rest is what is fuzzed.
// build_index_from refuses it with std::runtime_error or publishes a valid
// map (check_map); the map it published, sent on as a wire form, is
// accepted again and sends the same wire form (decode(encode(x)) == x once
// this node's own fields are in).
#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "index.h"
#include "index_wire.h"
#include "map_form.h"

using namespace monarch;
namespace fs = std::filesystem;

namespace {

// This process's dataset (an empty directory: build_index_from stats only
// its root) and where the maps go.
struct Place {
  fs::path dir;
  std::string root, out;
  uint64_t root_ino = 0;
  Place() {
    fs::path tmp = fs::exists("/dev/shm") ? "/dev/shm" : fs::temp_directory_path();
    dir = tmp / ("monarch-fuzz-index-wire-" + std::to_string(getpid()));
    fs::create_directories(dir / "ds");
    root = (dir / "ds").string();
    out = (dir / "index").string();
    struct stat st;
    FUZZ_CHECK(stat(root.c_str(), &st) == 0);
    root_ino = st.st_ino;
  }
  ~Place() { fs::remove_all(dir); }
};

const Place& place() {
  static const Place p;
  return p;
}

IndexOptions options(uint64_t generation) {
  return {.root = place().root,
          .out_path = place().out,
          .tier_dirs = {"/here/t0", "/here/t1"},
          .small_file_max = 1 << 20,
          .stall_ns = 200'000'000,
          .generation = generation};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string wire(fuzz::expanded_size(size), '\0');
  fuzz::expand(input, wire.data());
  Header h;
  std::memcpy(static_cast<void*>(&h), wire.data(), sizeof h);
  std::memset(h.root, 0, sizeof h.root);
  std::memcpy(h.root, place().root.data(), place().root.size());
  h.root_ino = place().root_ino;
  std::memcpy(wire.data(), static_cast<const void*>(&h), sizeof h);

  IndexStats stats;
  MappedMap got;
  try {
    got = build_index_from(options(7), wire, stats, [](JobMap& m) { fuzz::check_map(m); });
  } catch (const std::runtime_error& e) {
    FUZZ_CHECK(*e.what());
    return 0;
  }
  fuzz::check_map(got.map());
  FUZZ_CHECK(got.map().generation() == 7);
  FUZZ_CHECK(stats.files == got.map().size() && stats.dirs == got.map().dirs());
  for (uint64_t i = 0; i < got.map().size(); ++i)
    FUZZ_CHECK(got.map().state(uint32_t(i)).state == kNone);
  std::string sent = index_wire(got.map());
  MappedMap again = build_index_from(options(8), sent, stats, [](JobMap&) {});
  FUZZ_CHECK(index_wire(again.map()) == sent);
  return 0;
}
