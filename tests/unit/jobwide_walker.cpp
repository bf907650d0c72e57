// A walking node of a job-wide cache, in a process of its own so that a test
// can measure its memory while others ask it for the index (jobwide_test.cpp,
// JobWideMemory). Usage: ROOT DIR PORT PIECE_BYTES ANSWER_BYTES. It is node 0
// of the job {127.0.0.1, 127.0.0.2} (the test calls from 127.0.0.2), key
// "job-77-secret": it walks ROOT into DIR/index, writes the index's wire form
// to DIR, prints "serving" once every piece can be asked for, and serves
// until its standard input closes.
#include <fcntl.h>
#include <unistd.h>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "copier.h"
#include "index.h"
#include "jobwide.h"
#include "placement.h"

using namespace monarch;

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s ROOT DIR PORT PIECE_BYTES ANSWER_BYTES\n", argv[0]);
    return 2;
  }
  spdlog::set_default_logger(spdlog::stderr_logger_mt("walker"));  // stdout says "serving"
  std::string root = argv[1], dir = argv[2];
  static std::atomic<uint64_t> counters[kNumStagerCounters] = {};
  int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int root_fd = open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 || root_fd < 0) return perror("open"), 1;
  std::string error;
  uint16_t port = uint16_t(atoi(argv[3]));
  std::unique_ptr<JobWide> jw = JobWide::start({.nodes = {"127.0.0.1", "127.0.0.2"},
                                                .self = 0,
                                                .port_low = port,
                                                .port_high = port,
                                                .address = "127.0.0.1",
                                                .key = "job-77-secret",
                                                .wire_dir = dir_fd,
                                                .piece_bytes = strtoull(argv[4], nullptr, 10),
                                                .answer_bytes = strtoull(argv[5], nullptr, 10)},
                                               counters, error);
  if (!jw) return fprintf(stderr, "%s\n", error.c_str()), 1;
  IndexStats st;
  MappedMap map =
      build_index({.root = root, .out_path = dir + "/index", .tier_dirs = {dir}, .generation = 1},
                  st, [](JobMap&) {});
  Placement placement(
      {{uint64_t(1) << 30, 4096}}, [](int) { return uint64_t(1) << 30; }, 0);
  Copier copier(map.map(), placement,
                {.root_fd = root_fd,
                 .tier_fds = {dir_fd},
                 .block_sizes = {1 << 20},
                 .threads = 1,
                 .stage_ahead = false,
                 .fast_fs_check = false,
                 .peers = jw.get(),
                 .peer_threads = 1},
                counters);
  jw->serving(map.map(), copier, {dir_fd});
  while (counters[s_index_ms].load() == 0)  // the index's file written
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  printf("serving\n");
  fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  jw->stop();
  copier.stop();
  return 0;
}
