// monarch-bench-index DIR: builds the job map of DIR as the stager does and
// prints one JSON line: files, seconds, the map's bytes per file (entries,
// paths and hash buckets: what grows with the dataset), and peak RSS.
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "index.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: monarch-bench-index DIR\n");
    return 2;
  }
  std::string out = std::filesystem::temp_directory_path() /
                    ("monarch-bench-index-" + std::to_string(getpid()));
  monarch::IndexOptions o{.root = argv[1], .out_path = out};
  monarch::IndexStats stats;
  try {
    monarch::MappedMap m = monarch::build_index(o, stats, [](monarch::JobMap&) {});
    const monarch::Header& h = m.map().header();
    double per_file = stats.files ? double(h.slots_off - h.entries_off) / stats.files : 0;
    rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    std::printf("{\"files\":%llu,\"seconds\":%.4f,\"map_bytes_per_file\":%.1f,\"map_bytes\":%llu,"
                "\"peak_rss_kib\":%ld}\n",
                (unsigned long long)stats.files, stats.seconds, per_file,
                (unsigned long long)h.file_size, ru.ru_maxrss);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "monarch-bench-index: %s\n", e.what());
    unlink(out.c_str());
    return 1;
  }
  unlink(out.c_str());
  return 0;
}
