// Entry points of the Monarch SPANK plugin: each dispatches on spank_context()
// to the file of that context, and no exception crosses into Slurm.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>
#include <vector>

#include "plugin.h"
#include "shown.h"

// SPANK_PLUGIN() defines const variables, which C++ gives internal linkage;
// Slurm then refuses the plugin. Define them with C linkage by hand.
extern "C" const char plugin_name[] = "monarch";
extern "C" const char plugin_type[] = "spank";
extern "C" const unsigned int plugin_version = SLURM_VERSION_NUMBER;
extern "C" const unsigned int spank_plugin_version = 1;

namespace monarch::spank {

State& state() {
  static State s;
  return s;
}

void log_error(const std::string& message) {
  slurm_error("monarch: %s", shown(message).c_str());  // a path may hold a newline
}

void log_info(const std::string& message) {
  slurm_info("monarch: %s", shown(message).c_str());
}

void parse_args(int argc, char** argv) {
  State& s = state();
  if (s.args_parsed) return;
  s.args_parsed = true;
  parse_plugstack_args(std::vector<std::string_view>(argv, argv + argc), s.args, log_error);
}

namespace {

// The Slurm release this plugin was compiled against, as major.minor (22.05).
// A test build claims another one (MONARCH_SLURM_BUILT_FOR) to see the refusal.
#ifndef MONARCH_SLURM_BUILT_FOR
#define MONARCH_SLURM_BUILT_FOR SLURM_VERSION_NUMBER
#endif
constexpr unsigned kBuiltMajor = SLURM_VERSION_MAJOR(MONARCH_SLURM_BUILT_FOR);
constexpr unsigned kBuiltMinor = SLURM_VERSION_MINOR(MONARCH_SLURM_BUILT_FOR);

std::string release(unsigned major, unsigned minor) {
  char text[16];
  std::snprintf(text, sizeof text, "%u.%02u", major, minor);
  return text;
}

// Slurm checks the version of every plugin it loads except SPANK plugins
// (src/common/plugin.c), and a SPANK plugin built for another release reads
// Slurm's structures with the wrong layout. So each process compares the
// release that loaded it with the one it was built for, once; on a mismatch
// it logs one line and turns Monarch off (the options stay accepted and do
// nothing, as with enabled=no, so jobs that ask for Monarch still run).
void check_slurm_release(spank_t sp) {
  if (state().release_checked) return;
  state().release_checked = true;
  char* major = nullptr;
  char* minor = nullptr;
  if (spank_get_item(sp, S_SLURM_VERSION_MAJOR, &major) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_SLURM_VERSION_MINOR, &minor) != ESPANK_SUCCESS || !major || !minor)
    return;  // every release since 2.x answers; nothing to compare otherwise
  unsigned running_major = unsigned(std::strtoul(major, nullptr, 10));
  unsigned running_minor = unsigned(std::strtoul(minor, nullptr, 10));
  if (running_major == kBuiltMajor && running_minor == kBuiltMinor) return;
  std::string running = release(running_major, running_minor);
  log_error("built for Slurm " + release(kBuiltMajor, kBuiltMinor) + " but loaded by Slurm " +
            running + ": Monarch is off on this host; install the Monarch Slurm plugin built for " +
            running);
  state().args.enabled = false;
}

// Runs a hook; an exception becomes a log line and `on_error`.
template <class F>
int guarded(const char* hook, int on_error, F&& f) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    try {
      log_error(std::string(hook) + ": " + e.what());
    } catch (...) {
    }
  } catch (...) {
    slurm_error("monarch: %s: unexpected error", hook);
  }
  return on_error;
}

}  // namespace
}  // namespace monarch::spank

using namespace monarch::spank;

// The hooks. Everything that fails here leaves the job running without
// Monarch: only a refused option at submission returns an error (submit.cpp).
extern "C" {

// In slurmd (S_CTX_SLURMD) init runs once, when the daemon starts: Slurm
// 22.05 has no slurmd_init of its own.
int slurm_spank_init(spank_t sp, int ac, char** av) {
  return guarded("init", 0, [&] {
    parse_args(ac, av);
    check_slurm_release(sp);
    switch (spank_context()) {
      case S_CTX_LOCAL:
      case S_CTX_REMOTE:
      case S_CTX_ALLOCATOR:
        return register_options(sp);
      case S_CTX_SLURMD:
        return slurmd_init();
      default:
        return 0;
    }
  });
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char** av) {
  return guarded("init_post_opt", 0, [&] {
    parse_args(ac, av);
    check_slurm_release(sp);
    switch (spank_context()) {
      case S_CTX_REMOTE:
        return remote_init_post_opt(sp);
      default:
        return 0;
    }
  });
}

int slurm_spank_user_init(spank_t sp, int ac, char** av) {
  return guarded("user_init", 0,
                 [&] { return spank_context() == S_CTX_REMOTE ? remote_user_init(sp) : 0; });
}

int slurm_spank_task_init(spank_t sp, int ac, char** av) {
  return guarded("task_init", 0,
                 [&] { return spank_context() == S_CTX_REMOTE ? remote_task_init(sp) : 0; });
}

int slurm_spank_job_epilog(spank_t sp, int ac, char** av) {
  return guarded("job_epilog", 0, [&] {
    parse_args(ac, av);
    check_slurm_release(sp);
    return spank_context() == S_CTX_JOB_SCRIPT ? job_epilog(sp) : 0;
  });
}

}  // extern "C"
