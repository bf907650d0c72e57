// The index sent to the other nodes of a multi-node job (issue 9): one node
// walks the dataset, the others build their job map from its bytes, so the
// dataset is walked once per job however many nodes read it.
//
// The wire form is the walking node's map without its live part: the header
// (live fields cleared) and the static tables (entries, paths, buckets,
// attributes, directories). The receiving node writes its own map from it,
// with its own generation, tiers and settings, every file kNone, and device
// numbers of its own: a PFS mounted on several nodes may show a different
// st_dev on each, and the library compares devices to recognise dataset
// files. Only a dataset on a single device is renumbered; the receiver must
// walk a dataset spread over several (build_index_from says why).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "index.h"

namespace monarch {

// The wire form of a published map, handed to `out` in order, in pieces of
// at most kWireChunk bytes (a sender never holds it whole), each a copy that
// stays as given while `out` runs. The map's live words (the header's, each
// file's state, each directory's stale mark) are zero in it: a map gives one
// wire form whatever its node does meanwhile.
inline constexpr size_t kWireChunk = 4 << 20;
void index_wire_chunks(const JobMap& map, const std::function<void(const char*, size_t)>& out);
// The same, whole.
std::string index_wire(const JobMap& map);

// Builds this node's map from a wire form of `size` bytes that `read` copies
// out, [off, off + len) into dst, false when it cannot (checked as untrusted
// bytes: a damaged or foreign wire form throws, never maps out of bounds),
// published at opt.out_path like build_index. The tables go straight into the
// map, read in pieces of kWireChunk: no other copy is held. stats get the
// file, byte and directory counts (no metadata call is made but one stat of
// the root). Throws std::runtime_error saying why the wire form cannot serve
// this node: another dataset root, another version of Monarch, a damaged
// table, a dataset whose devices cannot be renumbered.
using WireReader = std::function<bool(uint64_t off, char* dst, size_t len)>;
MappedMap build_index_from(const IndexOptions& opt, uint64_t size, const WireReader& read,
                           IndexStats& stats, const std::function<void(JobMap&)>& before_publish);
// From bytes in memory, or from a file (read with pread).
MappedMap build_index_from(const IndexOptions& opt, std::string_view wire, IndexStats& stats,
                           const std::function<void(JobMap&)>& before_publish);
MappedMap build_index_from(const IndexOptions& opt, int fd, uint64_t size, IndexStats& stats,
                           const std::function<void(JobMap&)>& before_publish);

}  // namespace monarch
