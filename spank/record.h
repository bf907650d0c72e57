// The record the plugin keeps, as root, of what it made for a job on a
// tier: <tier>/.monarch/jobs/<key>, a few "name=value" lines in a directory
// only root can reach. It is written before anything is made, removed after
// everything is gone, and it is the only thing that makes the plugin act:
// a job's end, or a sweep, removes only what a record names. The job's
// identity for its report (user, groups, umask, as the job had them) comes
// from here, never from the password or group databases at the job's end.
// <key>.cgroups next to it lists the job's Monarch cgroups (cgroup.h),
// written by the child that joins them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "fd.h"

namespace monarch::spank {

struct JobRecord {
  std::string key;  // the job key: "job<ID>"
  JobSpace space = JobSpace::kDirectory;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  mode_t umask = 022;
  std::string user, home;
  std::string boot;       // the boot id when it was made: another boot, the job is gone
  uint32_t restarts = 0;  // Slurm's restart count of the job: a requeued job is a new run
  uint64_t mount_id = 0;  // kImage: the mount made at <tier>/monarch-<key>, once made
};

// Writes the record (a temporary file renamed over the old one). Throws.
void write_record(int jobs_fd, const JobRecord& record);

// The record of `key`; std::nullopt when there is none. A record that
// cannot be read back comes with `key` and `boot` only (an empty boot:
// stale), so that what it may name is still removed.
std::optional<JobRecord> read_record(int jobs_fd, const std::string& key);

// The keys of every record, at most `limit` of them.
std::vector<std::string> record_keys(int jobs_fd, size_t limit);

// The job's end holds its record (a shared lock on the file) from before it
// stops the stager until its space is released: a sweep run meanwhile by
// another job's end (several slurmd on one machine share the tiers) leaves
// the record to it. Fd(-1) when there is no record.
Fd hold_record(int jobs_fd, const std::string& key);
// Whether a job's end holds the record of `key` now.
bool record_held(int jobs_fd, const std::string& key);

// Removes the record and its cgroup list.
void remove_record(int jobs_fd, const std::string& key);

// The job's Monarch cgroup directories (one a line in <key>.cgroups).
std::vector<std::string> read_cgroup_record(int jobs_fd, const std::string& key);
std::string cgroup_record_name(const std::string& key);

}  // namespace monarch::spank
