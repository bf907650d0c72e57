// The statistics JSON (stats.h) as the stager writes it and the report reads
// it back (report.h): what the job controls goes in from the input (the
// dataset path and the other names, which may hold any byte; the command
// name a process leaves in the map; every counter of the job's processes,
// which a process of the job can set to anything; and the times of the
// stager's polls), and what the report reads is what was written
// (decode(encode(x)) == x): the names (as Unicode text, as_utf8, and shown()
// as a report shows them), the counters; the report renders it.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fuzz.h"
#include "index.h"
#include "placement.h"
#include "report.h"
#include "shown.h"
#include "stats.h"

using namespace monarch;
namespace fs = std::filesystem;

namespace {

// A job map of a small dataset, made once.
struct Job {
  fs::path dir;
  IndexStats index;
  MappedMap mapped;
  Job() {
    fs::path tmp = fs::exists("/dev/shm") ? "/dev/shm" : fs::temp_directory_path();
    dir = tmp / ("monarch-fuzz-stats-" + std::to_string(getpid()));
    fs::create_directories(dir / "ds/d");
    std::ofstream(dir / "ds/a") << "0123456789";
    std::ofstream(dir / "ds/d/b") << std::string(5000, 'b');
    IndexOptions o{.root = (dir / "ds").string(),
                   .out_path = (dir / "index").string(),
                   .tier_dirs = {dir.string()},
                   .generation = 1};
    mapped = build_index(o, index, [](JobMap&) {});
  }
  ~Job() { fs::remove_all(dir); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Job job;
  JobMap& map = job.mapped.map();
  Header& h = map.header();
  fuzz::Input in(data, size);
  JobInfo info;
  info.job = in.until('\0');
  info.host = in.until('\0');
  info.user = in.until('\0');
  info.dataset = in.until('\0');
  info.config_file = in.until('\0');
  info.consistency = "job";
  info.tier_names = {std::string(in.until('\0'))};
  info.tier_dirs = {job.dir.string()};
  std::string comm(in.until('\0').substr(0, sizeof h.first_attached_comm));
  std::memset(h.first_attached_comm, 0, sizeof h.first_attached_comm);
  std::memcpy(h.first_attached_comm, comm.data(), comm.size());
  h.first_attached_pid = in.take<int32_t>();
  h.first_attached_ns = monotonic_ns();
  h.attached = in.take<uint8_t>();
  h.next_slot = 1;

  std::atomic<uint64_t> stager[kNumStagerCounters] = {};
  ProcSlot& slot = map.slot(0);
  for (auto& c : slot.c) c = 0;
  Placement placement{{{1 << 30, 4096}}, [](int) { return uint64_t(1) << 30; }, 0};
  Stats stats(map, stager, placement, info, job.index);
  uint64_t t = monotonic_ns();
  // Polls: each one adds to a counter of the processes or of the stager.
  for (int poll = 0; poll < 64 && in.left(); ++poll) {
    uint8_t which = in.take<uint8_t>();
    uint64_t add = in.take<uint32_t>();
    if (which & 0x80)
      stager[(which & 0x7f) % kNumStagerCounters] += add;
    else
      slot.c[which % kNumCounters] += add;
    t += uint64_t(in.take<uint16_t>()) * 1'000'000;
    stats.tick(t);
    stats.sample(t);
  }
  std::string json = stats.json(true, 0);

  Figures f;
  try {
    f = figures(json);
    summary_text(json);
    report_svg(json);
    FUZZ_CHECK(stats_of(report_json(json)) == stats_of(json));
  } catch (const ReportError& e) {
    std::fprintf(stderr, "%s\n%s\n", e.what(), json.c_str());
    FUZZ_CHECK(!"the report refuses the statistics the stager wrote");
  }
  auto text = [](std::string_view s) { return shown(as_utf8(s)); };
  FUZZ_CHECK(f.job == as_utf8(info.job));
  FUZZ_CHECK(f.host == text(info.host) && f.user == text(info.user));
  FUZZ_CHECK(f.dataset == text(info.dataset));
  FUZZ_CHECK(f.tiers.size() == 1 && f.tiers[0].name == text(info.tier_names[0]));
  FUZZ_CHECK(f.attached == h.attached.load());
  if (h.first_attached_pid > 0) {
    FUZZ_CHECK(f.first_pid == h.first_attached_pid.load());
    FUZZ_CHECK(f.first_command == text(comm.substr(0, strnlen(comm.c_str(), comm.size()))));
  }
  FUZZ_CHECK(f.total.opens == double(slot.c[c_opens].load()));
  FUZZ_CHECK(f.total.job_pfs_bytes == double(slot.c[c_pfs_bytes].load()));
  FUZZ_CHECK(f.total.stager_pfs_bytes == double(stager[s_pfs_bytes].load()));
  FUZZ_CHECK(f.complete);
  return 0;
}
