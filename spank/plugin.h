// The Monarch SPANK plugin: what its files share. plugin.cpp holds the
// extern "C" entry points and dispatches each on spank_context(); one file
// per context holds that context's hooks:
//   submit.cpp      sbatch/salloc (allocator) and srun (local): the options,
//                   checked in the submitting user's own context
//   stepd.cpp       slurmstepd (remote): the job's space on each tier, the
//                   stager, the tasks' environment
//   job_script.cpp  job_epilog (root, a fresh process per call): stop the
//                   stager, the report as the user, release the job's space
//   slurmd.cpp      slurmd start: sweep what jobs left behind
// and the pieces they share: process (children as the user), proc (/proc),
// tier, record, job_space, image, mounts, cgroup, sweep.
// Every function here may throw; only plugin.cpp catches, at the C boundary.
#pragma once

extern "C" {
#include <slurm/spank.h>
}

#include <optional>
#include <string>

#include "args.h"
#include "config.h"
#include "process.h"
#include "record.h"

extern "C" const char plugin_name[];  // "monarch": names the options' environment variables

namespace monarch::spank {

// What the user asked for with the options.
struct Request {
  bool dataset_given = false;
  std::string dataset;   // --monarch-dataset
  std::string report;    // --monarch-report, empty for the default
  bool verbose = false;  // --monarch-verbose
};

// A step of a Monarch job, planned by init_post_opt (as root: the job's
// space made on every tier) for user_init (the stager started).
struct StepPlan {
  uint32_t job = 0;
  std::string key;  // "job<ID>": names the job's directories, record and stager
  User user;
  Config config;
  JobRecord record;
  StagerLaunch launch;  // user_init adds the job's cgroups
};

// All the plugin's state in one process (sbatch, srun, slurmstepd or the
// job-script process). Reached through state(): option callbacks get no handle.
struct State {
  bool args_parsed = false;
  bool release_checked = false;  // the Slurm release that loaded us was compared
  Args args;
  Request request;
  // Remote context, from init_post_opt to the later hooks:
  std::optional<StepPlan> plan;
  std::string disabled;  // why this step runs without Monarch ("" when it does)
  // The job's record on every tier, held (record.h) from the moment the
  // step made or found the job's space until slurmstepd exits: a sweep by
  // another job's end on this node leaves a job alone while any of its steps
  // lives here, whatever the step's process title says yet.
  std::vector<Fd> held;
};

State& state();

// Parses the plugstack arguments into state().args once (args.h), logging
// what it reports.
void parse_args(int argc, char** argv);

// submit.cpp
int register_options(spank_t sp);
int job_script_getopt(spank_t sp);  // reads the options back in job_prolog/job_epilog

// stepd.cpp
int remote_init_post_opt(spank_t sp);
int remote_user_init(spank_t sp);
int remote_task_init(spank_t sp);

// job_script.cpp
int job_epilog(spank_t sp);

// slurmd.cpp
int slurmd_init();

// "monarch: " + message, to Slurm's log (and to the user where Slurm shows it).
void log_error(const std::string& message);
void log_info(const std::string& message);

}  // namespace monarch::spank
