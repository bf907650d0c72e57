// What /proc says about the processes of jobs, read as root without
// trusting anything a user can write: a process is a job's stager only if
// its uids, its executable and its command line all say so, and a job runs
// on this node while one of its slurmstepd processes (root's, executable
// slurmstepd*, titled "slurmstepd: [ID.STEP]") or its stager lives.
// Reads only small files of /proc; command lines only of root's slurmstepd
// and of processes running the installed stager, which no user can hold up.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace monarch::spank {

// Is `pid` a live (not zombie) stager of job `key`, running as `uid` (all
// four uids) from the executable `program`, with "--job KEY" in its argv?
bool is_job_stager(pid_t pid, const std::string& program, uid_t uid, const std::string& key);

// The pids of the live stagers of job `key` run by `uid` from `program`.
std::vector<pid_t> find_job_stagers(const std::string& program, uid_t uid, const std::string& key);

// The jobs alive on this node: their ids from slurmstepd titles, and the
// job keys of live stagers (run from `program`) with the uid each runs as
// (all four uids alike): a stager counts only for a job of its own user.
struct LiveJobs {
  std::set<uint32_t> stepd_jobs;
  std::set<std::pair<std::string, uid_t>> stagers;
};
LiveJobs live_jobs(const std::string& program);

// The kernel's boot id: a record made under another boot is of a job that
// is gone.
std::string boot_id();

}  // namespace monarch::spank
