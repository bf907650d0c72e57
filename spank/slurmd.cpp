// slurmd start (slurm_spank_init in the slurmd context, root, in slurmd
// itself; Slurm 22.05 has no slurmd_init callback): sweeps
// what jobs left on the tiers when their epilog never ran (the node crashed
// or rebooted, slurmd was down, an epilog was killed), then purges the
// trash in the background. Bounded work: slurmd waits for it.
#include "plugin.h"
#include "sweep.h"

namespace monarch::spank {

int slurmd_init() {
  const State& s = state();
  if (!s.args.enabled) return 0;
  Config config;
  try {
    config = load_config(s.args.config);
  } catch (const ConfigError& e) {
    log_error(std::string("slurmd start: node configuration: ") + e.what() +
              "; the tiers are not swept");
    return 0;
  }
  std::vector<Fd> images;
  SweepResult r = sweep(config, "", images);
  if (r.swept || r.problems)
    log_info("slurmd start: swept " + std::to_string(r.swept) + " job(s) that left their space, " +
             std::to_string(r.kept) + " still running, " + std::to_string(r.problems) +
             " problem(s)");
  purge_tiers(config, images);
  return 0;
}

}  // namespace monarch::spank
