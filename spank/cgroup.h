// The job's Monarch cgroup: a leaf named "monarch" under the job's own
// cgroup (the "job_<ID>" directory Slurm's cgroup plugins make), in every
// hierarchy where the job has one, cgroup v1 and v2 alike. The stager (and
// the report at the job's end) join it before they exec: their memory is
// charged to the job and bound by its limits, they run on the job's CPUs
// and devices, they outlive the step that started them (Slurm kills by
// step), and everything in the leaf is killed when the job ends. A job
// without cgroups (proctrack/linuxproc, task/none) has no leaf: its stager
// is stopped by the epilog alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "process.h"

namespace monarch::spank {

// The leaves to join for job `job_id`, found from the caller's own cgroups
// (slurmstepd's, once Slurm has made the job's: user_init) and the cgroup
// mounts under /sys/fs/cgroup. A v1 cpuset leaf copies the job's CPUs and
// memory nodes. Empty when the job has no cgroup.
std::vector<CgroupJoin> job_cgroup_leaves(uint32_t job_id);

// Kills every process in the leaves (and waits, at most `timeout_s`, for
// them to go), removes the leaves, then the job's cgroup and the user's
// above it where they are empty (Slurm could not remove them while the
// leaf was there). Returns how many processes it killed.
int remove_job_cgroups(const std::vector<std::string>& leaves, unsigned timeout_s);

}  // namespace monarch::spank
