// libmonarch_jobwide.so's one entry (jobwide.h). The module holds the
// job-wide cache and links UCX and libcrypto, which the stager loads only
// for a multi-node job (jobwide_load.h).
#include "jobwide.h"

namespace monarch {

extern "C" JobWide* monarch_jobwide_start(JobWideOptions* options,
                                          std::atomic<uint64_t>* stager_counters,
                                          std::string* error) noexcept {
  try {
    return JobWide::start(std::move(*options), stager_counters, *error).release();
  } catch (const std::exception& e) {
    try {
      *error = std::string("the job-wide cache did not start: ") + e.what();
    } catch (...) {
    }
  } catch (...) {
  }
  return nullptr;
}

}  // namespace monarch
