// A multi-node job's node names looked up (jobwide.h): bounded in threads
// and in time, whatever the name service does.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace monarch {

inline constexpr size_t kResolveThreads = 32;

// The names' IPv4 addresses (numeric), looked up by at most kResolveThreads
// threads at once and waited for at most timeout_ms: a name service that
// hangs delays the start that long, no more. A name not resolved by then is
// left out, and no thread starts another lookup.
std::map<std::string, std::string> resolve_nodes(const std::vector<std::string>& names,
                                                 unsigned timeout_ms);

}  // namespace monarch
