// The job's Monarch cgroup: a leaf named "monarch" under the job's own
// cgroup (the "job_<ID>" directory Slurm's cgroup plugins make), in every
// hierarchy where the job has one. The stager (and the report at the job's
// end) join it before they exec: their memory is charged to the job and
// bound by its limits, they run on the job's CPUs and devices, they outlive
// the step that started them (Slurm kills by step), and everything in the
// leaf is killed when the job ends. A job without cgroups
// (proctrack/linuxproc, task/none) has no leaf: its stager is stopped by the
// epilog alone.
//
// cgroup v1 (cgroup/v1: a hierarchy per controller) and v2 (cgroup/v2: one
// unified hierarchy) differ in how a leaf is set up, how its charge is read
// and how it is emptied. cgroup_version() is the one place that tells them
// apart, from the file system itself; each operation below has one
// implementation per version. Joining is the same in both (a write of the
// pid to the leaf's cgroup.procs: fork_as_user, process.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "process.h"

namespace monarch::spank {

enum class CgroupVersion {
  kNone,  // not a cgroup file system
  kV1,    // a cgroup v1 hierarchy (one or more controllers, or a named one)
  kV2,    // the cgroup v2 unified hierarchy
};

// What `dir` lies on, from statfs(2).
CgroupVersion cgroup_version(const std::string& dir);

// The job's own cgroup directories ("<mount>/<path>/job_<ID>") named by
// `proc_cgroup` (the text of /proc/self/cgroup: "ID:CONTROLLERS:PATH" lines)
// in the cgroup file systems `mountinfo` (the text of /proc/self/mountinfo)
// mounts below /sys/fs/cgroup/. One per hierarchy where the job has one.
std::vector<std::string> job_cgroup_dirs(uint32_t job_id, const std::string& proc_cgroup,
                                         const std::string& mountinfo);

// Create the leaf: how a process joins Monarch's leaf below `job_dir`. v1:
// a cpuset leaf starts empty and takes no process, so it gets the job's
// CPUs and memory nodes first; v2: the leaf inherits them.
CgroupJoin leaf_join(const std::string& job_dir, CgroupVersion version);

// The leaves to join for job `job_id`, found from the caller's own cgroups
// (slurmstepd's, once Slurm has made the job's: user_init). Empty when the
// job has no cgroup.
std::vector<CgroupJoin> job_cgroup_leaves(uint32_t job_id);

// Read the charge: the most memory the leaf's processes have used together,
// page cache included (v1: memory.max_usage_in_bytes; v2: memory.peak).
// None where the leaf has no memory controller, or (v2) before Linux 5.19,
// which has no peak (memory.current, what the leaf holds now, is not one).
std::optional<uint64_t> memory_peak(const std::string& leaf, CgroupVersion version);

// Kill the leaf: SIGKILL to every process in it, each only while a pidfd
// holds it and it is still listed there (a reused pid is never signalled).
// v2 (Linux 5.14+) kills the whole leaf at once with cgroup.kill. The
// signals take effect later: leaf_empty() says when.
void kill_leaf(const std::string& leaf, CgroupVersion version);

// Is the leaf empty? (v2: of descendants too, cgroup.events.)
bool leaf_empty(const std::string& leaf, CgroupVersion version);

struct RemovedCgroups {
  int killed = 0;                       // processes that were left in the leaves (signalled)
  std::optional<uint64_t> memory_peak;  // the leaves' largest (none: no memory controller)
  std::vector<std::string> left;        // leaves that could not be removed (still populated)
};

// Reads the leaves' memory peak, kills every process in them (and waits, at
// most `timeout_s`, for them to go), removes the leaves (`left` names those
// it could not: a process that did not die in time, as one in uninterruptible
// sleep), then the job's
// cgroup and (v1) the user's above it where they are empty (Slurm could not
// remove them while the leaf was there). Only paths below /sys/fs/cgroup/
// whose last component is the leaf's name are touched.
RemovedCgroups remove_job_cgroups(const std::vector<std::string>& leaves, unsigned timeout_s);

// The seconds the job's end and the sweep give a stale job's leaves to empty.
inline constexpr unsigned kCgroupTimeout = 5;

// The log line for a leaf remove_job_cgroups left (RemovedCgroups::left).
std::string left_leaf_text(const std::string& leaf, unsigned timeout_s);

}  // namespace monarch::spank
