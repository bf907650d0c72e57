// The record the plugin keeps, as root, of what it made for a job on a
// tier: <tier>/.monarch/jobs/<key>, a few "name=value" lines in a directory
// only root can reach. It is written before anything is made, removed after
// everything is gone, and it is the only thing that makes the plugin act:
// a job's end, or a sweep, removes only what a record names. The job's
// identity for its report (uid, gid, groups, umask, as Slurm gave them to the
// job) comes from here, never from the password or group databases at the
// job's end. A record holds only values root derived (numbers, the boot id),
// never a string from the job's environment, and its reader is strict: a
// control character, an unknown, repeated or missing name, or a malformed
// value make the record damaged, and nothing in a damaged record is trusted
// but the key it is filed under and how its space was made.
// <key>.cgroups next to it lists the job's Monarch cgroups (cgroup.h),
// written by the child that joins them.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
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
  std::string boot;       // the boot id when it was made: another boot, the job is gone
  uint32_t restarts = 0;  // Slurm's restart count of the job: a requeued job is a new run
  uint64_t mount_id = 0;  // the mount made at <tier>/monarch-<key>, once made
  bool damaged = false;   // read back damaged: only key and space are meaningful
};

// Writes the record (a temporary file renamed over the old one). Throws.
void write_record(int jobs_fd, const JobRecord& record);

// The record of `key`; std::nullopt when there is none. A damaged record
// comes with `damaged`, `key` and, where its line was well formed, `space`
// (uid 0, an empty boot: stale), so that what it may name is still removed
// and nothing is run for it.
std::optional<JobRecord> read_record(int jobs_fd, const std::string& key);

// The record as text, and back: `key` is the name it is filed under.
std::string record_text(const JobRecord& record);
JobRecord parse_record(const std::string& key, std::string_view text);

// The keys of every record, at most `limit` of them.
std::vector<std::string> record_keys(int jobs_fd, size_t limit);

// A shared lock on the job's record, which a sweep run by another job's end
// on the node (or by another slurmd sharing the tiers) takes for "the job is
// here": every step's slurmstepd holds it from making or finding the job's
// space until it exits, and the job's end from before it stops the stager
// until its space is released. The kernel drops it with its last holder.
// Fd(-1) when there is no record.
Fd hold_record(int jobs_fd, const std::string& key);
// Whether a step or the end of the job holds the record of `key` now.
bool record_held(int jobs_fd, const std::string& key);

// Removes the record and its cgroup list.
void remove_record(int jobs_fd, const std::string& key);

// The job's Monarch cgroup directories (one a line in <key>.cgroups).
std::vector<std::string> read_cgroup_record(int jobs_fd, const std::string& key);
std::string cgroup_record_name(const std::string& key);

}  // namespace monarch::spank
