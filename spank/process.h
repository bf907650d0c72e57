// Processes the plugin starts as the job's user and stops as root: the
// stager, and the report. Used from slurmstepd (remote context, as root) and
// from the job-script process (root). Children are forked from a
// multi-threaded slurmstepd: everything they need is prepared before fork,
// and between fork and exec they make async-signal-safe calls only.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace monarch::spank {

// Who the job runs as. Everything the plugin runs for a job runs as this
// user: real, effective and saved uid and gid, and the supplementary groups.
struct User {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the primary one included
  std::string name, home;
};

// Fills name and home from the password database; `groups` empty: from the
// group database (getgrouplist). Throws std::runtime_error.
User lookup_user(uid_t uid, gid_t gid, std::vector<gid_t> groups);

// A minimal environment for a program run for the user.
std::vector<std::string> user_environment(const User& user);

struct StagerLaunch {
  std::string program;  // the installed monarch-stager
  std::vector<std::string> args;
  std::vector<std::string> env;
  std::string lock_path;  // <tier0>/monarch-<key>/stager.lock: held while a stager runs
  unsigned timeout_s = 30;  // 0: do not wait for the stager's answer
  User user;
};

enum class StagerState {
  kReady,    // a new stager answered "ready"
  kRunning,  // a stager of this job already runs on this node
  kStarted,  // started, not waited for (timeout 0)
  kFailed,   // "error: ..." or exited without an answer; message says why
  kTimeout,  // no answer in time; the stager was stopped
};

struct StagerStart {
  StagerState state;
  std::string message;
};

// Starts the stager as launch.user in its own session, with a cleared signal
// mask and default handlers, stdin/stdout/stderr on /dev/null, not a child of
// the caller (it outlives the step), and waits for its answer on a pipe
// (--ready-fd) for at most launch.timeout_s. Unless the user's lock file is
// held already (checked as the user), which answers kRunning at once.
StagerStart start_stager(const StagerLaunch& launch);

// Stops the stagers of job `key` that run as `uid` from the executable
// `program`, found by scanning /proc (all uids, /proc/PID/exe, "--job KEY" in
// the command line) and signalled through a pidfd checked again after it was
// opened: SIGTERM, then SIGKILL after timeout_s. Never trusts a pid read from
// a file. Returns how many it found.
int stop_stagers(const std::string& program, uid_t uid, const std::string& key, unsigned timeout_s);

// Runs argv as the user (in its own session, cwd "/", stdin on /dev/null),
// killed after timeout_s. Returns the exit status (128+signal when killed,
// -1 when it could not run) and what it wrote to stdout/stderr (the first 4 KiB).
int run_as_user(const User& user, const std::vector<std::string>& argv,
                const std::vector<std::string>& env, unsigned timeout_s, std::string& output);

}  // namespace monarch::spank
