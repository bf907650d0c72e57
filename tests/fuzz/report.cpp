// monarch-report's reader (report.h): statistics or a report, any bytes (a
// job's stats.json is in the user's job directory; a report may come from
// anywhere). Every rendering returns or throws ReportError, nothing else;
// of a text it accepts, the report JSON is accepted in turn and embeds the
// very statistics (decode(encode(x)) == x), with the same figures.
#include "report.h"
#include "fuzz.h"

using namespace monarch;

namespace {

// Runs `f`; false when it refused the input with a ReportError, which says why.
template <typename F>
bool accepted(F f) {
  try {
    f();
    return true;
  } catch (const ReportError& e) {
    FUZZ_CHECK(*e.what());
    return false;
  }
}

void same(const Figures& a, const Figures& b) {
  FUZZ_CHECK(a.job == b.job && a.host == b.host && a.user == b.user && a.dataset == b.dataset);
  FUZZ_CHECK(a.complete == b.complete && a.epochs.size() == b.epochs.size());
  FUZZ_CHECK(a.tiers.size() == b.tiers.size() && a.fallbacks.size() == b.fallbacks.size());
  FUZZ_CHECK(a.verdict.bound == b.verdict.bound);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > kMaxStatsBytes) return 0;  // refused unread by monarch-report
  std::string json(reinterpret_cast<const char*>(data), size);
  std::string stats, report;
  Figures f;
  bool ok = accepted([&] { stats = stats_of(json); });
  FUZZ_CHECK(accepted([&] { f = figures(json); }) == ok);
  FUZZ_CHECK(accepted([&] { summary_text(json); }) == ok);
  FUZZ_CHECK(accepted([&] { report_svg(json); }) == ok);
  FUZZ_CHECK(accepted([&] { report = report_json(json); }) == ok);
  FUZZ_CHECK(accepted([&] { job_summary_text({json, json}); }) == ok);
  if (!ok) return 0;
  std::string again;
  FUZZ_CHECK(accepted([&] { again = stats_of(report); }));
  FUZZ_CHECK(again == stats);
  Figures g;
  FUZZ_CHECK(accepted([&] { g = figures(report); }));
  same(f, g);
  return 0;
}
