#include "jobwide_load.h"

#include <dlfcn.h>
#include <unistd.h>

#include "programs.h"

#ifndef MONARCH_JOBWIDE_PATH
#define MONARCH_JOBWIDE_PATH "/usr/local/lib/monarch/libmonarch_jobwide.so"
#endif

namespace monarch {

std::unique_ptr<JobWide> load_jobwide(JobWideOptions options,
                                      std::atomic<uint64_t>* stager_counters, std::string& error) {
  std::string dir = exe_dir(), path = dir + "/libmonarch_jobwide.so";
  if (dir.empty() || access(path.c_str(), F_OK) != 0) path = MONARCH_JOBWIDE_PATH;
  void* module = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  void* entry = module ? dlsym(module, "monarch_jobwide_start") : nullptr;
  if (!entry) {
    const char* why = dlerror();
    error = "cannot load the job-wide cache (the monarch package installs it): " +
            std::string(why ? why : path + ": no entry monarch_jobwide_start");
    return nullptr;
  }
  auto start = reinterpret_cast<decltype(&monarch_jobwide_start)>(entry);
  return std::unique_ptr<JobWide>(start(jobwide_abi().c_str(), &options, stager_counters, &error));
}

}  // namespace monarch
