// Writes the fuzz targets' seed corpora into DIR/<target>/ from Monarch's own
// encoders (the index, the wire form, the statistics, the messages' structs)
// and the shipped etc/monarch.conf: small real inputs. Run by hand when a
// format changes: fuzz_make_corpus tests/fuzz/corpus SOURCE_DIR.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "index.h"
#include "index_wire.h"
#include "jobwide.h"
#include "map_form.h"
#include "peers.h"
#include "placement.h"
#include "protocol.h"
#include "stats.h"

// report.h's, declared here: report.h and jobwide.h (through fast_fs.h)
// each define a monarch::Verdict, so one file cannot include both.
namespace monarch {
std::string report_json(const std::string& json);
}

using namespace monarch;
namespace fs = std::filesystem;
namespace wire = monarch::peers::wire;

namespace {

fs::path out;

void put(const std::string& target, const std::string& name, std::string_view bytes) {
  fs::create_directories(out / target);
  std::ofstream(out / target / name, std::ios::binary).write(bytes.data(), bytes.size());
}

// A literal with its NULs, less the one that ends it.
template <size_t N>
std::string lit(const char (&s)[N]) {
  return std::string(s, N - 1);
}

template <typename T>
std::string bytes_of(const T& t) {
  return std::string(reinterpret_cast<const char*>(&t), sizeof t);
}

// A dataset of `files` files in `dirs` directories (and a hard link), its map
// and its wire form; the statistics of a job that read it twice.
void maps(const fs::path& tmp, const std::string& name, int dirs, int files) {
  fs::path root = "/tmp/monarch-fuzz-ds";  // index_wire's seeds: any root (the target sets its own)
  fs::remove_all(root);
  fs::create_directories(root);
  for (int d = 0; d < dirs; ++d) fs::create_directories(root / ("d" + std::to_string(d)) / "sub");
  for (int i = 0; i < files; ++i) {
    fs::path p =
        root / (dirs ? "d" + std::to_string(i % dirs) + "/sub" : "") / ("f" + std::to_string(i));
    std::ofstream(p) << std::string(100 * i, 'x');
  }
  if (files) fs::create_hard_link(root / (dirs ? "d0/sub/f0" : "f0"), root / "link");
  IndexOptions o{.root = root.string(),
                 .out_path = (tmp / "index").string(),
                 .tier_dirs = {"/var/tmp/monarch-job1", "/dev/shm/monarch-job1"},
                 .small_file_max = 1 << 20,
                 .stall_ns = 200'000'000,
                 .generation = 42};
  IndexStats st;
  MappedMap m = build_index(o, st, [](JobMap&) {});
  const Header& h = m.map().header();
  put("jobmap", name, fuzz::compact(static_cast<const char*>(m.base()), h.slots_off));
  std::string w = index_wire(m.map());
  put("index_wire", name, fuzz::compact(w.data(), w.size()));
  if (files == 0) return;

  std::atomic<uint64_t> stager[kNumStagerCounters] = {};
  Placement placement{{{1 << 30, 4096}}, [](int) { return uint64_t(1) << 30; }, 0};
  JobInfo info{.job = "job" + std::to_string(files),
               .host = "node1",
               .user = "alice",
               .dataset = root.string(),
               .consistency = "job",
               .config_file = "/etc/monarch/monarch.conf",
               .tier_names = {"nvme"},
               .tier_dirs = {"/var/tmp/monarch-job1"},
               .copy_threads = 8};
  Stats stats(m.map(), stager, placement, info, st);
  ProcSlot& slot = m.map().slot(0);
  uint64_t t = monotonic_ns();
  for (int pass = 0; pass < 2; ++pass) {
    slot.c[c_opens] += files;
    slot.c[c_tier_bytes] += h.dataset_bytes / 2;
    slot.c[c_pfs_served_bytes] += h.dataset_bytes - h.dataset_bytes / 2;
    for (int b = 0; b < kPassBuckets; ++b) slot.c[c_pass_opens + b] += files;
    stager[s_pfs_bytes] += h.dataset_bytes / 2;
    t += 1'000'000'000;
    stats.tick(t);
    stats.sample(t);
  }
  std::string json = stats.json(true, 1.5);
  put("report", name + ".stats.json", json);
  put("report", name + ".report.json", report_json(json));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fuzz_make_corpus OUT_DIR SOURCE_DIR\n");
    return 2;
  }
  out = argv[1];
  fs::path source = argv[2];
  fs::path tmp = fs::temp_directory_path() / ("monarch-fuzz-corpus-" + std::to_string(getpid()));
  fs::create_directories(tmp);
  maps(tmp, "empty", 0, 0);
  maps(tmp, "flat", 0, 5);
  maps(tmp, "tree", 3, 12);
  fs::remove_all("/tmp/monarch-fuzz-ds");
  fs::remove_all(tmp);

  // protocol: the first byte says how the datagram came (bit 0 cut, bit 1
  // peer reads, bits 2-3 descriptors); the generation and file count are the
  // target's.
  auto message = [](uint8_t how, Request type, uint32_t file, uint64_t off = 0, uint64_t len = 0) {
    Message m{.type = type,
              .generation = 0x6d6f6e6172636821,
              .file = file,
              .pid = 4711,
              .off = off,
              .len = len};
    return std::string(1, char(how)) + bytes_of(m);
  };
  put("protocol", "place", message(0, Request::kPlace, 3));
  put("protocol", "data", message(2 << 2, Request::kData, 999));
  put("protocol", "stale", message(0, Request::kStale, 0));
  put("protocol", "release", message(0, Request::kRelease, 7));
  put("protocol", "peer-read", message(1 << 2 | 2, Request::kPeerRead, 5, 4096, 1 << 20));
  put("protocol", "cut", message(1, Request::kPlace, 3).substr(0, 20));

  // peers: the first byte picks the decoder (peers.cpp).
  wire::RequestHeader rq{wire::kMagic, 0, 3, 5, 9, {}};
  uint64_t length = 56;
  put("peers", "request", std::string(1, 0) + bytes_of(length) + std::string(1, 0) + bytes_of(rq));
  put("peers", "answer",
      std::string(1, 1) + bytes_of(wire::AnswerHeader{wire::kMagic, wire::kAnswerOk, 3, 5, {}}));
  put("peers", "hello", std::string(1, 2) + bytes_of(wire::Hello{wire::kMagic, 0, {1, 2, 3}}));
  put("peers", "proof",
      std::string(1, 3) + bytes_of(wire::Proof{wire::kMagic, 40, {4, 5}, "node1", {}}) +
          std::string(40, 'a'));
  put("peers", "welcome",
      std::string(1, 4) + bytes_of(wire::Welcome{wire::kMagic, 40, 77, {}}) + std::string(40, 'a'));
  put("peers", "jobwide-fetch",
      std::string(1, 5) +
          bytes_of(JobWideRequest{
              .type = JobWideRequest::kFetch, .file = 3, .off = 4096, .len = 1 << 20}));
  put("peers", "jobwide-index",
      std::string(1, 5) + bytes_of(JobWideRequest{.type = JobWideRequest::kIndex, .len = 4 << 20}));
  std::string seqs(1, 6);
  for (uint64_t s : {1, 2, 5, 3, 3, 200, 150, 136, 137, 1}) seqs += bytes_of(s);
  put("peers", "window", seqs);

  // config: the shipped file, and a few of its variants.
  std::ifstream conf(source / "etc/monarch.conf");
  std::string shipped((std::istreambuf_iterator<char>(conf)), std::istreambuf_iterator<char>());
  put("config", "shipped.conf", shipped);
  put("config", "two-tiers.conf",
      "copy_threads = 4\nconsistency = open\nstage_ahead_window = 5%\npeer_ports = 7400-7899\n"
      "[tier.nvme]\npath = /local/nvme\nquota = 80%\nblock_size = 4M\n"
      "[tier.ram]\npath = /dev/shm\nquota = 16G\n");
  put("config", "tiers-args", "/local/nvme:500G\n/dev/shm:50%\n/tmp\n");
  put("config", "size", "64K");

  put("spank_args", "both", lit("config=/etc/monarch/monarch.conf\0enabled=yes"));
  put("spank_args", "off", "enabled=no");
  put("spank_args", "unknown", lit("verbose=1\0config=relative"));

  put("hostlist", "slurm", "n[1-3,07],gpu[01-02]a");
  put("hostlist", "one", "node1");
  put("hostlist", "groups", "a[1-2]b[3-4],c");
  put("hostlist", "range", "x[0-99]");

  // stats: job, host, user, dataset, config file, tier, command (each ended
  // by a NUL), the first process's pid and the processes (4 + 1 bytes), then
  // polls of 7 bytes: counter, amount, milliseconds later.
  std::string names = lit(
      "job42\0node1\0alice\0/scratch/alice/imagenet\0/etc/monarch/monarch.conf\0nvme\0python\0");
  std::string first = names + bytes_of(int32_t(4711)) + std::string(1, 3);
  std::string polls;
  for (uint8_t c : {uint8_t(c_opens), uint8_t(c_tier_bytes), uint8_t(0x80 | s_pfs_bytes)})
    polls += std::string(1, char(c)) + bytes_of(uint32_t(1 << 20)) + bytes_of(uint16_t(500));
  put("stats", "polls", first + polls);
  return 0;
}
