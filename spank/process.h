// Processes the plugin starts for a job, and stops: the stager and the
// report as the job's user, mkfs as root. Started from slurmstepd (root, or
// with the user's euid in user_init) and from the job-script process
// (root). Children of a multi-threaded slurmstepd: everything they need is
// prepared before fork, and between fork and exec they make
// async-signal-safe calls only. Every wait on a child has a deadline, after
// which the child is killed: nothing the user does to a child (stopping it,
// a FUSE mount it blocks on) holds up root.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace monarch::spank {

// Who the job runs as, as Slurm gives it. Everything the plugin runs for a
// job runs as this user (real, effective and saved uid and gid, and the
// supplementary groups), and never as uid 0.
struct User {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the primary one included
  std::string name, home;     // for the environment only: USER and LOGNAME (none if empty), HOME
};

// A minimal environment for a program run for the user.
std::vector<std::string> user_environment(const User& user);

// A cgroup a child joins: `dir` is made if missing; `copy` lists files
// (from, to) copied first (a v1 cpuset starts empty and takes no process).
struct CgroupJoin {
  std::string dir;
  std::vector<std::pair<std::string, std::string>> copy;
};

struct Limit {
  int resource;  // RLIMIT_*
  rlim_t soft, hard;
};

// How a child is set up between fork and exec.
struct ChildSetup {
  const User* user = nullptr;       // nullptr: the child stays root
  std::vector<CgroupJoin> cgroups;  // joined as root, before becoming the user
  std::string cgroup_record;        // root's file that gets the joined dirs, one a line ("": none)
  std::vector<Limit> limits;
  mode_t umask = 077;
  int out = -1;    // stdout and stderr; -1: /dev/null
  int keep = -1;   // kept open as descriptor 3; -1: none
  int keep2 = -1;  // kept open as descriptor 4 (needs keep); -1: none
};

// Forks a child that: takes root back if the caller runs with a user's
// euid (user_init), clears its signal mask and handlers (slurmstepd blocks
// signals in the forking thread), starts a session of its own, sets
// oom_score_adj to 0 (slurmstepd's is -1000), joins the cgroups and writes
// their record, sets the limits and the umask, becomes the user for good,
// and goes to "/" with stdin on /dev/null. Returns as fork() does: 0 in the
// child (ready to exec), the pid in the parent, -1 when fork fails. A child
// whose set-up fails writes "error: WHAT\n" on `error_fd` and exits 126.
pid_t fork_as_user(const ChildSetup& setup, int error_fd);

struct StagerLaunch {
  std::string program;            // the installed monarch-stager
  std::string key;                // the job key, given as --job: names the job's directories
  std::vector<std::string> args;  // the others
  std::vector<std::string> env;
  std::string secret;       // the job's key (job_key.h), written to the stager's --key-fd 4
  std::string lock_path;    // <tier0>/monarch-<key>/stager.lock: held while a stager runs
  unsigned timeout_s = 30;  // 0: do not wait for the stager's answer
  ChildSetup setup;         // user, cgroups, limits, umask
};

enum class StagerState {
  kReady,    // a new stager answered "ready"
  kRunning,  // a stager of this job already runs on this node
  kStarted,  // started, not waited for (timeout 0)
  kFailed,   // "error: ..." or exited without an answer; message says why
  kTimeout,  // no answer in time; the stager was killed
};

struct StagerStart {
  StagerState state;
  std::string message;
};

// Starts the stager: a child set up by fork_as_user checks the job's lock
// (a stager runs already: kRunning), forks the stager (which is thus
// nobody's child once this child exits, and outlives the step), waits for
// its answer on --ready-fd for at most launch.timeout_s and kills it when
// none comes, then passes the answer on and exits. The caller waits for the
// child a little longer than that and kills it if it must.
StagerStart start_stager(const StagerLaunch& launch);

// Stops the stagers of job `key` that run as `uid` from `program`, found in
// /proc (proc.h) and signalled through a pidfd checked again after it was
// opened: SIGTERM, then SIGKILL after timeout_s. Never trusts a pid read
// from a file. Returns how many it found.
int stop_stagers(const std::string& program, uid_t uid, const std::string& key, unsigned timeout_s);

// Runs argv set up as `setup` says (stdout and stderr captured), killed
// with its process group after timeout_s. Returns the exit status (128 +
// signal when killed, -1 when it could not run) and the first 4 KiB of its
// output.
int run_process(const ChildSetup& setup, const std::vector<std::string>& argv,
                const std::vector<std::string>& env, unsigned timeout_s, std::string& output);

}  // namespace monarch::spank
