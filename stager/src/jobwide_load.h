// The stager's way to the job-wide cache (jobwide.h): its module, loaded
// only for a multi-node job, so that a single-node stager starts without UCX
// and libcrypto (about 6 MiB of libraries to read; its own memory 6 MiB
// instead of 9, contrib/bench/run --only scale).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "jobwide.h"

namespace monarch {

// JobWide::start through libmonarch_jobwide.so: the module beside this
// program (a build tree), else the installed one. Null with `error` (naming
// the module and why) when it cannot be loaded or the cache cannot start.
// The module stays loaded for the life of the process.
std::unique_ptr<JobWide> load_jobwide(JobWideOptions options,
                                      std::atomic<uint64_t>* stager_counters, std::string& error);

}  // namespace monarch
