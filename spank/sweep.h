// The sweep: what jobs left on the tiers when their epilog never ran (the
// node crashed or rebooted, slurmd was down) or could not finish. Runs when
// slurmd starts (slurm_spank_init in its slurmd context) and at the end of
// every job that used Monarch. A record is stale when it was made under
// another boot, or when neither a slurmstepd nor a stager of its job, run
// as the record's user, runs on the node (proc.h); its space is released
// (job_space.h) and its cgroups removed. Then the trash of every tier is
// purged in the background. Only records are acted on: an entry of the
// tier no record names is left alone.
#pragma once

#include <string>
#include <vector>

#include "config.h"
#include "fd.h"

namespace monarch::spank {

struct SweepResult {
  int swept = 0;     // stale jobs released
  int kept = 0;      // records of jobs still running
  int problems = 0;  // records that could not be completed (logged)
};

// Sweeps every tier of `config`; `skip` is a key not to touch (the job
// whose epilog this is, already released). Logs one line per job swept.
// The images it released, still held, are added to `images`.
SweepResult sweep(const Config& config, const std::string& skip, std::vector<Fd>& images);

// Starts monarch-purge on every tier whose trash holds anything, handing
// `images` (released images still held: job_space.h) to the first one,
// which lets them go; closes them here when no purge starts.
void purge_tiers(const Config& config, std::vector<Fd>& images);

}  // namespace monarch::spank
