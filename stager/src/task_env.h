// The environment Monarch gives the processes of a job, computed once for
// the plugin (spank/stepd.cpp), monarch-run and the tests: what a task needs
// outside a container, and what Apptainer/Singularity need to carry the same
// into one (their environment and bind rules, README "Containers"). The
// enroot hook (etc/enroot/90-monarch.sh) reads the MONARCH_* names below.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace monarch {

// Set by monarch-run and the plugin besides jobmap.h's kEnvDataset, kEnvJobDir,
// kEnvJobDirs, kEnvLog: the library's host path, for what binds it into a
// container (the enroot hook, README "Containers").
inline constexpr const char* kEnvLibrary = "MONARCH_INTERPOSE_LIB";

// One change to an environment: set `name` to `value`, or unset it.
struct EnvChange {
  std::string name;
  std::optional<std::string> value;
};

// A variable's current value, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

struct TaskEnv {
  std::string library;                // absolute path of libmonarch_interpose.so
  std::string dataset;                // the dataset root as the job gave it
  std::vector<std::string> job_dirs;  // the job's directory on every tier, tier 0 first
  bool log = false;                   // MONARCH_LOG=1
};

// The changes that make `env` a Monarch task's environment:
//   LD_PRELOAD, APPTAINERENV_LD_PRELOAD, SINGULARITYENV_LD_PRELOAD: the
//     library appended to what is there (once: a nested step inherits it);
//   MONARCH_DATASET, MONARCH_JOB_DIR (tier 0's), MONARCH_JOB_DIRS (all,
//     colon-separated), MONARCH_INTERPOSE_LIB, MONARCH_LOG when asked for,
//     each also as APPTAINERENV_ and SINGULARITYENV_ (Apptainer's
//     --cleanenv passes only those);
//   APPTAINER_BINDPATH, SINGULARITY_BINDPATH: the library and every job
//     directory appended (comma-separated, at the same path inside).
// Throws std::invalid_argument for a path these lists cannot carry (a
// colon, a comma, white space or a control character in it).
std::vector<EnvChange> monarch_task_env(const TaskEnv& task, const EnvLookup& env);

// The changes that take monarch_task_env's back out of `env` (a step without
// Monarch under one with it): the library out of the preload and bind lists
// (a list left empty is unset), the MONARCH_ variables and their
// APPTAINERENV_/SINGULARITYENV_ forms unset. What the user had in those
// lists stays, in its order.
std::vector<EnvChange> monarch_clear_env(const std::string& library, const EnvLookup& env);

}  // namespace monarch
