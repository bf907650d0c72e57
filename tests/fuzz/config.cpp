// monarch.conf (config.h): parsed, or refused with a ConfigError that names
// the file; a configuration accepted holds only values its keys accept
// (etc/monarch.conf). The tiers monarch-run takes on its command line
// (override_tiers): the same. parse_size: a size, or std::invalid_argument;
// the number it accepts, written back in bytes, parses to itself.
#include <set>

#include "config.h"
#include "fuzz.h"

using namespace monarch;

namespace {

void check_accepted(const Config& c) {
  FUZZ_CHECK(!c.tiers.empty() && c.tiers.size() <= size_t(kMaxTiers));
  std::set<std::string> names;
  for (const TierConfig& t : c.tiers) {
    FUZZ_CHECK(names.insert(t.name).second);
    FUZZ_CHECK(!t.path.empty() && t.path[0] == '/');
    FUZZ_CHECK(t.path.find("/../") == std::string::npos && !t.path.ends_with("/.."));
    FUZZ_CHECK((t.quota_bytes > 0) != (t.quota_percent > 0));
    FUZZ_CHECK(t.quota_percent >= 0 && t.quota_percent <= 100);
    FUZZ_CHECK(t.block_size >= (64 << 10) && t.block_size <= (1ull << 30));
  }
  FUZZ_CHECK(c.copy_threads >= 1 && c.copy_threads <= 256);
  FUZZ_CHECK(c.report_dir.empty() || c.report_dir[0] == '/');
  FUZZ_CHECK(!c.job_key_secret.empty() && c.job_key_secret[0] == '/');
  FUZZ_CHECK(c.small_file_max <= (64u << 20));
  FUZZ_CHECK(c.stage_ahead_window_percent >= 0 && c.stage_ahead_window_percent <= 100);
  FUZZ_CHECK(c.stall_timeout_ms >= 1 && c.stall_timeout_ms <= 60000);
  FUZZ_CHECK(c.start_timeout_s <= 3600);
  FUZZ_CHECK(c.stop_timeout_s >= 1 && c.stop_timeout_s <= 600);
  FUZZ_CHECK(c.peer_port_low >= 1024 && c.peer_port_low <= c.peer_port_high &&
             c.peer_port_high <= 65535);
  FUZZ_CHECK(c.peer_timeout_ms >= 1 && c.peer_timeout_ms <= 60000);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  Config c;
  bool accepted = false;
  try {
    c = parse_config(text, "fuzz.conf");
    accepted = true;
  } catch (const ConfigError& e) {
    FUZZ_CHECK(std::string_view(e.what()).starts_with("fuzz.conf"));
  }
  if (accepted) {
    FUZZ_CHECK(c.source == "fuzz.conf");
    check_accepted(c);
  }

  // The same bytes as monarch-run's --tier arguments, one a line.
  Config tiers = accepted ? c : Config{.tiers = {{.name = "t", .path = "/t", .quota_bytes = 1}}};
  std::vector<std::string> specs;
  fuzz::Input in(data, size);
  while (in.left() && specs.size() < 8) specs.emplace_back(in.until('\n'));
  try {
    override_tiers(tiers, specs);
    check_accepted(tiers);
  } catch (const ConfigError&) {
  }

  try {
    uint64_t n = parse_size(text);
    FUZZ_CHECK(parse_size(std::to_string(n)) == n);
  } catch (const std::invalid_argument& e) {
    FUZZ_CHECK(*e.what());
  }
  return 0;
}
