// Building the job map: a parallel walk of the dataset (oneTBB) that records
// every regular file once per node, then a single file that all processes map.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "jobmap.h"

namespace monarch {

struct IndexOptions {
  std::string root;                    // dataset root, absolute and lexically normal
  std::string out_path;                // final name of the map file; written as out_path + ".tmp"
  std::vector<std::string> tier_dirs;  // job directory on each tier, fastest first
  uint32_t consistency = 0;
  uint64_t small_file_max = 0;
  uint64_t stall_ns = 0;
  uint64_t generation = 0;
  uint64_t index_rate = 0;  // metadata calls per second the walk may make, 0: unpaced
  // Set while the walk runs (the job ended before its index was complete):
  // the walk ends at once, and the map holds the files found so far.
  const std::atomic<bool>* stop = nullptr;
};

struct IndexStats {
  uint64_t files = 0, bytes = 0, dirs = 0;
  uint64_t skipped = 0;         // symbolic links, devices, sockets, fifos: read from the PFS
  uint64_t unreadable = 0;      // directories that could not be listed
  double seconds = 0;           // walk and write
  uint64_t metadata_calls = 0;  // stat and opendir calls the walk made
  bool stopped = false;         // the walk ended early (IndexOptions::stop)
};

// A mapped job map, owned: unmapped on destruction.
class MappedMap {
 public:
  MappedMap() = default;
  MappedMap(void* base, size_t size) : base_(base), size_(size), map_(base, size) {}
  MappedMap(MappedMap&& o) noexcept { *this = std::move(o); }
  MappedMap& operator=(MappedMap&& o) noexcept;
  ~MappedMap();
  JobMap& map() { return map_; }
  // Makes the view again, after the header was written.
  void reload() { map_ = JobMap(base_, size_); }
  size_t bytes() const { return size_; }
  void* base() const { return base_; }

 private:
  void* base_ = nullptr;
  size_t size_ = 0;
  JobMap map_;
};

// Walks the dataset and writes the map. `before_publish` runs on the complete
// map before it is renamed into place (the stager marks adopted copies there).
// Throws std::runtime_error with the path and reason when the root cannot be
// walked or the map cannot be written.
MappedMap build_index(const IndexOptions& options, IndexStats& stats,
                      const std::function<void(JobMap&)>& before_publish);

// Writes this node's tiers into a map's header: each job directory's path
// and identity. Throws std::runtime_error when one is too long.
void set_tiers(Header& h, const std::vector<std::string>& tier_dirs);

// Maps an existing map file read-write. Throws std::runtime_error.
MappedMap open_index(const std::string& path);

// Creates `out_path`.tmp (replacing a leftover) of `total` bytes, allocated,
// not sparse (on a full file system a page first touched later would kill
// the process that touches it: SIGBUS), mapped read-write and zeroed.
// Throws std::runtime_error naming the file and the reason.
MappedMap create_map_file(const std::string& out_path, uint64_t total);

}  // namespace monarch
