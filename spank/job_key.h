// The secret the stagers of one multi-node job share (stager/src/jobwide.h),
// derived by the plugin as root for that job alone, the same on every node
// of the job:
//   key = HMAC-SHA256(secret, "monarch-job-key-v1" job id, uid, restarts)
// `secret` is the site's job_key_secret (monarch.conf(5)): a file every node
// holds and no user can read, by default munge's key, which every node of a
// Slurm cluster that authenticates with munge shares already. Every input
// comes from Slurm, none from the job's environment: a key is never reused by
// another job (array tasks, jobs submitted from a job, a requeued run), and
// no user can compute another job's key, nor so the ports the stagers
// listen on (derived from the key: stager/src/peers.h). The key reaches the
// stager through a descriptor (process.h), never through an environment.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "config.h"

namespace monarch::spank {

struct JobKey {
  std::string secret;  // 64 hex digits
};

struct JobKeyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws JobKeyError naming the file and what is wrong with it: missing,
// not a regular file, readable or writable by others than its owner, owned
// by neither root nor a system account (uid 999 at most), shorter than 32
// bytes or longer than 64 KiB.
JobKey derive_job_key(const Config& config, uint32_t job, uid_t uid, uint32_t restarts);

}  // namespace monarch::spank
