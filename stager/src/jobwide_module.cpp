// libmonarch_jobwide.so's one entry (jobwide.h). The module holds the
// job-wide cache and links UCX and libcrypto, which the stager loads only
// for a multi-node job (jobwide_load.h).
#include "jobwide.h"

namespace monarch {

extern "C" JobWide* monarch_jobwide_start(const char* abi, JobWideOptions* options,
                                          std::atomic<uint64_t>* stager_counters,
                                          std::string* error) noexcept {
  try {
    std::string own = jobwide_abi();
    if (own != abi) {
      *error = "the job-wide cache's module is from another build of Monarch (" + own +
               ", the stager " + abi + "): reinstall the monarch package";
      return nullptr;
    }
    return JobWide::start(std::move(*options), stager_counters, *error).release();
  } catch (const std::exception& e) {
    try {
      *error = std::string("the job-wide cache did not start: ") + e.what();
    } catch (...) {
    }
  } catch (...) {
    try {
      *error = "the job-wide cache did not start";
    } catch (...) {
    }
  }
  return nullptr;
}

}  // namespace monarch
