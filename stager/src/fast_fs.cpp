#include "fast_fs.h"

#include <algorithm>
#include <cmath>

namespace monarch {
namespace {

double median(std::vector<double>& v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

}  // namespace

Verdict fast_by_tier(std::vector<TierSample> samples) {
  if (samples.empty()) return {};
  std::vector<double> opens, ratios;
  for (const TierSample& s : samples) {
    opens.push_back(double(s.open_ns));
    ratios.push_back(s.tier_ns ? double(s.pfs_ns) / double(s.tier_ns) : HUGE_VAL);
  }
  Verdict v{.open_us = median(opens) / 1e3, .read = median(ratios)};
  v.fast = v.open_us <= kFastOpenUs && v.read <= kFastRatio;
  return v;
}

Verdict fast_by_rates(uint64_t opens, uint64_t open_ns, uint64_t bytes, uint64_t read_ns) {
  if (opens < kJudgeOpens || bytes < kJudgeBytes || !read_ns) return {};
  Verdict v{.open_us = double(open_ns) / double(opens) / 1e3,
            .read = double(bytes) / double(read_ns)};  // bytes a ns: GB/s
  v.fast = v.open_us <= kFastOpenUs && v.read >= kFastGBs;
  return v;
}

}  // namespace monarch
