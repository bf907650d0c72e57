#include "sweep.h"

#include <cstdlib>

#include "cgroup.h"
#include "job_space.h"
#include "plugin.h"
#include "proc.h"
#include "record.h"
#include "tier.h"
#include "trash.h"

namespace monarch::spank {
namespace {

constexpr size_t kMaxRecords = 100000;  // per sweep and tier: far more jobs than a node runs

// The job id of "job<ID>", 0 for anything else.
uint32_t job_id_of(const std::string& key) {
  if (!key.starts_with("job") || key.size() > 13) return 0;
  char* end = nullptr;
  unsigned long id = std::strtoul(key.c_str() + 3, &end, 10);
  return *end || id > UINT32_MAX ? 0 : uint32_t(id);
}

}  // namespace

SweepResult sweep(const Config& config, const std::string& skip, std::vector<Fd>& images) {
  SweepResult out;
  std::string boot = boot_id();
  LiveJobs live = live_jobs(MONARCH_STAGER);
  for (const TierConfig& tc : config.tiers) {
    try {
      Tier tier = open_tier(tc, /*create=*/false);
      if (!tier.has_state()) continue;
      TierLock lock(tier, config.start_timeout_s + 10);
      for (const std::string& key : record_keys(tier.jobs.get(), kMaxRecords)) {
        if (key == skip) continue;
        std::optional<JobRecord> record = read_record(tier.jobs.get(), key);
        if (!record) continue;
        uint32_t id = job_id_of(key);
        bool same_boot = !record->boot.empty() && record->boot == boot;
        if (same_boot && (live.stepd_jobs.count(id) || live.stagers.count({key, record->uid}) ||
                          record_held(tier.jobs.get(), key))) {
          out.kept++;
          continue;
        }
        for (const std::string& leaf :
             remove_job_cgroups(read_cgroup_record(tier.jobs.get(), key), kCgroupTimeout).left)
          log_error(key + ": " + left_leaf_text(leaf, kCgroupTimeout));
        Release r = release_space(tier, *record);
        if (r.image) images.push_back(std::move(r.image));
        if (!r.problem.empty()) {
          out.problems++;
          log_error(key + ": sweeping tier " + tc.name + ": " + r.problem +
                    "; the record stays for the next sweep");
          continue;
        }
        out.swept++;
        log_info(key + ": swept from tier " + tc.name + " (" +
                 (same_boot ? "the job no longer runs here" : "made before the node rebooted") +
                 "; its epilog did not clean up)");
      }
    } catch (const TierError& e) {
      out.problems++;
      log_error(std::string("sweep: ") + e.what());
    } catch (const std::exception& e) {
      out.problems++;
      log_error(std::string("sweep: tier ") + tc.name + ": " + e.what());
    }
  }
  return out;
}

void purge_tiers(const Config& config, std::vector<Fd>& images) {
  for (const TierConfig& tc : config.tiers) {
    try {
      Tier tier = open_tier(tc, /*create=*/false);
      if (!tier.has_state() || !trash_has_entries(tier.trash.get())) continue;
      std::vector<int> hand_over;
      for (const Fd& fd : images) hand_over.push_back(fd.get());
      std::string error;
      if (!start_purge(tier.trash_path, tier.root_path + "/.monarch/purge.log", hand_over, error))
        log_error("cannot start the purge of " + tier.trash_path + ": " + error);
      else
        images.clear();  // the purge holds them now
    } catch (const std::exception& e) {
      log_error(std::string("purge: ") + e.what());
    }
  }
  images.clear();
}

}  // namespace monarch::spank
