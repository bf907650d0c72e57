// The Monarch SPANK plugin: what its files share. plugin.cpp holds the
// extern "C" entry points and dispatches each on spank_context(); one file
// per context holds that context's hooks:
//   submit.cpp      sbatch/salloc (allocator) and srun (local): the options,
//                   checked in the submitting user's own context
//   stepd.cpp       slurmstepd (remote): tier directories, the stager, the
//                   tasks' environment
//   job_script.cpp  job_epilog (root, a fresh process per call): stop the
//                   stager, the report as the user, safe cleanup
// Every function here may throw; only plugin.cpp catches, at the C boundary.
#pragma once

extern "C" {
#include <slurm/spank.h>
}

#include <string>

extern "C" const char plugin_name[];  // "monarch": names the options' environment variables

namespace monarch::spank {

// Arguments from plugstack.conf ("required spank_monarch.so key=value ..."),
// parsed once per process, defaults first.
struct Args {
  std::string config = MONARCH_SPANK_CONFIG;  // the node configuration
  bool enabled = true;                        // enabled=no: the options have no effect
};

// What the user asked for with the options.
struct Request {
  bool dataset_given = false;
  std::string dataset;  // --monarch-dataset
  std::string report;   // --monarch-report, empty for the default
  bool verbose = false; // --monarch-verbose
};

// All the plugin's state in one process (sbatch, srun, slurmstepd or the
// job-script process). Reached through state(): option callbacks get no handle.
struct State {
  bool args_parsed = false;
  bool release_checked = false;  // the Slurm release that loaded us was compared
  Args args;
  Request request;
  // Remote context, filled by init_post_opt for the task hooks:
  std::string disabled;  // why this step runs without Monarch ("" when it does)
};

State& state();

// Parses the plugstack arguments into state().args once; logs an unknown
// argument by name and ignores it; a bad value turns the plugin off.
void parse_args(int argc, char** argv);

// submit.cpp
int register_options(spank_t sp);
int job_script_getopt(spank_t sp);  // reads the options back in job_prolog/job_epilog

// stepd.cpp
int remote_init_post_opt(spank_t sp);
int remote_task_init(spank_t sp);

// job_script.cpp
int job_epilog(spank_t sp);

// "monarch: " + message, to Slurm's log (and to the user where Slurm shows it).
void log_error(const std::string& message);
void log_info(const std::string& message);

}  // namespace monarch::spank
