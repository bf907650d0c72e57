#include "config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>

#include <boost/program_options/options_description.hpp>
#include <boost/program_options/parsers.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "jobmap.h"

namespace monarch {
namespace po = boost::program_options;

namespace {

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

// Line numbers of each key occurrence, in file order, as "section.key" the way
// program_options names them. program_options itself does not report lines.
std::vector<std::pair<std::string, int>> key_lines(const std::string& text) {
  std::vector<std::pair<std::string, int>> lines;
  std::istringstream in(text);
  std::string line, section;
  for (int n = 1; std::getline(in, line); ++n) {
    std::string t = trim(line.substr(0, line.find('#')));
    if (t.empty()) continue;
    if (t.front() == '[' && t.back() == ']') {
      section = trim(t.substr(1, t.size() - 2));
      continue;
    }
    size_t eq = t.find('=');
    std::string key = trim(t.substr(0, eq));
    lines.emplace_back(section.empty() ? key : section + "." + key, n);
  }
  return lines;
}

// Finds the first line that holds `needle`, for syntax errors that
// program_options reports without a line number.
int line_containing(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    if (!needle.empty() && line.find(needle) != std::string::npos) return n;
  return 0;
}

struct Reader {
  std::string file;
  std::vector<std::pair<std::string, int>> lines;
  std::map<std::string, int> seen;  // occurrences so far, to find the right line

  int line_of(const std::string& key) {
    int want = seen[key]++, n = 0;
    for (auto& [k, l] : lines)
      if (k == key && n++ == want) return l;
    return 0;
  }
  [[noreturn]] void fail(int line, const std::string& key, const std::string& value,
                         const std::string& why) const {
    std::ostringstream m;
    m << file << ":" << line << ": key '" << key << "'";
    if (!value.empty()) m << ", value '" << value << "'";
    m << ": " << why;
    throw ConfigError(m.str());
  }
};

bool parse_bool(const std::string& v, bool& out) {
  if (v == "yes" || v == "true" || v == "on" || v == "1") return out = true, true;
  if (v == "no" || v == "false" || v == "off" || v == "0") return out = false, true;
  return false;
}

unsigned parse_count(const std::string& v, unsigned lo, unsigned hi) {
  char* end = nullptr;
  errno = 0;
  unsigned long n = std::strtoul(v.c_str(), &end, 10);
  if (v.empty() || *end || errno || n < lo || n > hi || v[0] == '-')
    throw std::invalid_argument("");
  return static_cast<unsigned>(n);
}

constexpr const char* kQuotaAccepted =
    "a size such as 500G or a share of the file system such as 80%";

// "80%" (a share, above 0 and at most 100) or a size ("500G"). Throws
// std::invalid_argument with the reason, "" when the accepted values say it.
struct Share {
  uint64_t bytes = 0;
  double percent = 0;
};
Share parse_share(const std::string& v) {
  if (!v.empty() && v.back() == '%') {
    char* end = nullptr;
    double p = std::strtod(v.c_str(), &end);
    if (end != v.c_str() + v.size() - 1 || !(p > 0 && p <= 100))
      throw std::invalid_argument("a percentage must be above 0 and at most 100");
    return {0, p};
  }
  try {
    return {parse_size(v), 0};
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("");
  }
}

void parse_quota(const std::string& v, TierConfig& tier) {
  Share q = parse_share(v);
  if (!q.percent && !q.bytes) throw std::invalid_argument("must not be 0");
  tier.quota_bytes = q.bytes;
  tier.quota_percent = q.percent;
}

void check_tier_path(const std::string& path) {
  if (path.empty() || path[0] != '/') throw std::invalid_argument("must be an absolute path");
  if (path.find("/../") != std::string::npos || path.ends_with("/.."))
    throw std::invalid_argument("must not contain '..'");
}

// "reason; accepted: what" or "accepted: what".
std::string with_accepted(const std::string& reason, const std::string& accepted) {
  return (reason.empty() ? "" : reason + "; ") + "accepted: " + accepted;
}

// One key of monarch.conf: its name, the values it accepts in words (every
// error about it ends with them, and monarch.conf(5) quotes them: a test
// compares), and how a value is stored into `Target` (Config, or TierConfig
// for [tier.NAME]). `set` throws std::invalid_argument with a reason, or ""
// when the accepted values say it all.
template <class Target>
struct KeyRule {
  std::string name, accepted;
  std::function<void(const std::string& value, Target&)> set;
};

template <class Target>
KeyRule<Target> count_key(const char* name, unsigned lo, unsigned hi, unsigned Target::*field) {
  return {name, "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi),
          [=](const std::string& v, Target& t) { t.*field = parse_count(v, lo, hi); }};
}

template <class Target>
KeyRule<Target> size_key(const char* name, uint64_t lo, uint64_t hi, const char* lo_text,
                         const char* hi_text, uint64_t Target::*field) {
  return {name,
          std::string("a size from ") + lo_text + " to " + hi_text +
              " (bytes, or with a K, M, G or T suffix: powers of 1024)",
          [=](const std::string& v, Target& t) {
            uint64_t n;
            try {
              n = parse_size(v);
            } catch (const std::invalid_argument&) {
              throw std::invalid_argument("");
            }
            if (n < lo || n > hi) throw std::invalid_argument("");
            t.*field = n;
          }};
}

// A key whose value is one of a few words, each naming a value of the field.
template <class Target, class T>
KeyRule<Target> choice_key(const char* name, std::vector<std::pair<std::string, T>> choices,
                           T Target::*field) {
  std::string accepted;
  for (const auto& [word, value] : choices) accepted += (accepted.empty() ? "" : ", ") + word;
  return {name, accepted, [=](const std::string& v, Target& t) {
            for (const auto& [word, value] : choices)
              if (v == word) return void(t.*field = value);
            throw std::invalid_argument("");
          }};
}

// The general keys, before any section, in the order monarch.conf(5) lists them.
const std::vector<KeyRule<Config>>& general_keys() {
  static const std::vector<KeyRule<Config>> keys = {
      count_key("copy_threads", 1, 256, &Config::copy_threads),
      choice_key<Config, std::string>("log_level",
                                      {{"trace", "trace"},
                                       {"debug", "debug"},
                                       {"info", "info"},
                                       {"warn", "warn"},
                                       {"error", "error"},
                                       {"off", "off"}},
                                      &Config::log_level),
      {"report_dir", "an absolute path, or nothing for the job's working directory",
       [](const std::string& v, Config& c) {
         if (!v.empty() && v[0] != '/') throw std::invalid_argument("not an absolute path");
         c.report_dir = v;
       }},
      choice_key<Config, Consistency>("consistency",
                                      {{"job", Consistency::kJob}, {"open", Consistency::kOpen}},
                                      &Config::consistency),
      size_key("small_file_max", 0, 64u << 20, "0", "64M", &Config::small_file_max),
      {"stage_ahead", "yes, no",
       [](const std::string& v, Config& c) {
         if (!parse_bool(v, c.stage_ahead)) throw std::invalid_argument("");
       }},
      {"stage_ahead_window", "a size such as 2G or a share of the dataset such as 5%",
       [](const std::string& v, Config& c) {
         Share w = parse_share(v);
         c.stage_ahead_window = w.bytes;
         c.stage_ahead_window_percent = w.percent;
       }},
      {"copy_fast_dataset", "yes, no",
       [](const std::string& v, Config& c) {
         if (!parse_bool(v, c.copy_fast_dataset)) throw std::invalid_argument("");
       }},
      count_key("stall_timeout", 1, 60000, &Config::stall_timeout_ms),
      count_key("index_rate", 0, 10'000'000, &Config::index_rate),
      count_key("start_timeout", 0, 3600, &Config::start_timeout_s),
      count_key("stop_timeout", 1, 600, &Config::stop_timeout_s),
      choice_key<Config, JobSpace>(
          "job_space", {{"image", JobSpace::kImage}, {"directory", JobSpace::kDirectory}},
          &Config::job_space),
      {"job_wide", "yes, no",
       [](const std::string& v, Config& c) {
         if (!parse_bool(v, c.job_wide)) throw std::invalid_argument("");
       }},
      {"peer_ports", "a range of ports LOW-HIGH within 1024-65535, such as 7400-7899",
       [](const std::string& v, Config& c) {
         unsigned lo = 0, hi = 0;
         char dash = 0, extra = 0;
         if (std::sscanf(v.c_str(), "%5u%c%5u%c", &lo, &dash, &hi, &extra) != 3 || dash != '-' ||
             lo < 1024 || hi > 65535 || hi < lo)
           throw std::invalid_argument("");
         c.peer_port_low = lo;
         c.peer_port_high = hi;
       }},
      {"job_key_secret", "an absolute path",
       [](const std::string& v, Config& c) {
         if (v.empty() || v[0] != '/') throw std::invalid_argument("not an absolute path");
         c.job_key_secret = v;
       }},
      count_key("peer_timeout", 1, 60000, &Config::peer_timeout_ms),
  };
  return keys;
}

// The keys of a [tier.NAME] section.
const std::vector<KeyRule<TierConfig>>& tier_keys() {
  static const std::vector<KeyRule<TierConfig>> keys = {
      {"path", "an absolute path without '..'",
       [](const std::string& v, TierConfig& t) {
         check_tier_path(v);
         t.path = v;
       }},
      {"quota", kQuotaAccepted, [](const std::string& v, TierConfig& t) { parse_quota(v, t); }},
      size_key("block_size", 64 << 10, 1ull << 30, "64K", "1G", &TierConfig::block_size),
  };
  return keys;
}

template <class Target>
std::string names_of(const std::vector<KeyRule<Target>>& keys) {
  std::string out;
  for (const KeyRule<Target>& k : keys) out += (out.empty() ? "" : ", ") + k.name;
  return out;
}

// Stores `value` with the rule named `field`; false when there is none.
template <class Target>
bool apply(const std::vector<KeyRule<Target>>& keys, const std::string& field,
           const std::string& value, Target& target) {
  for (const KeyRule<Target>& k : keys) {
    if (k.name != field) continue;
    try {
      k.set(value, target);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(with_accepted(e.what(), k.accepted));
    }
    return true;
  }
  return false;
}

}  // namespace

uint64_t parse_size(std::string_view text) {
  const char* accepted = "accepted: a number of bytes with an optional K, M, G or T suffix";
  std::string s = trim(text);
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0])))
    throw std::invalid_argument(accepted);
  char* end = nullptr;
  errno = 0;
  unsigned long long n = std::strtoull(s.c_str(), &end, 10);
  if (errno) throw std::invalid_argument(accepted);
  std::string suffix = end;
  if (suffix.size() == 2 && (suffix[1] == 'B' || suffix[1] == 'b')) suffix.pop_back();
  int shift = 0;
  if (suffix.empty())
    shift = 0;
  else if (suffix == "K" || suffix == "k")
    shift = 10;
  else if (suffix == "M" || suffix == "m")
    shift = 20;
  else if (suffix == "G" || suffix == "g")
    shift = 30;
  else if (suffix == "T" || suffix == "t")
    shift = 40;
  else
    throw std::invalid_argument(accepted);
  if (shift && n > (~0ull >> shift)) throw std::invalid_argument("too large");
  return n << shift;
}

Config load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw ConfigError(path + ": cannot read the configuration: " + std::strerror(errno) +
                      " (set the path with --config or the plugstack.conf argument config=)");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_config(text, path);
}

Config parse_config(const std::string& text, const std::string& path) {
  Reader r{path, key_lines(text), {}};
  po::parsed_options parsed(nullptr);
  try {
    std::istringstream stream(text);
    po::options_description none;
    parsed = po::parse_config_file(stream, none, /*allow_unregistered=*/true);
  } catch (const po::invalid_config_file_syntax& e) {
    // Never e.what() of program_options (1.74): it substitutes the line into
    // its message until no placeholder is left, forever when the line holds
    // one ("%invalid_line%"). The line, found to report its number.
    std::string bad = e.tokens();
    throw ConfigError(path + ":" + std::to_string(line_containing(text, bad)) +
                      ": the configuration file contains an invalid line '" + bad +
                      "' (expected 'key = value' or '[section]')");
  } catch (const po::error&) {
    throw ConfigError(path + ": not a configuration file (expected 'key = value' or '[section]')");
  }

  Config c;
  c.source = path;
  std::map<std::string, size_t> tier_index;  // section name -> position in c.tiers
  std::set<std::string> keys_seen;
  for (const po::option& o : parsed.options) {
    const std::string& key = o.string_key;
    std::string value = o.value.empty() ? "" : trim(o.value[0]);
    int line = r.line_of(key);
    if (!keys_seen.insert(key).second) r.fail(line, key, value, "is set twice");
    try {
      if (key.starts_with("tier.")) {
        size_t dot = key.rfind('.');
        std::string name = key.substr(5, dot - 5), field = key.substr(dot + 1);
        if (dot <= 5 || name.find('.') != std::string::npos)
          r.fail(line, key, value, "tier sections are named [tier.NAME]");
        auto [it, added] = tier_index.emplace(name, c.tiers.size());
        if (added) {
          if (c.tiers.size() == kMaxTiers)
            r.fail(line, key, value, "at most " + std::to_string(kMaxTiers) + " tiers");
          c.tiers.push_back(TierConfig{.name = name});
        }
        if (!apply(tier_keys(), field, value, c.tiers[it->second]))
          r.fail(line, key, value,
                 "unknown key; accepted in [tier.NAME]: " + names_of(tier_keys()));
      } else if (key.find('.') != std::string::npos) {
        r.fail(line, key, value,
               "unknown section; accepted: general keys before any section, and [tier.NAME]");
      } else if (!apply(general_keys(), key, value, c)) {
        r.fail(line, key, value, "unknown key; accepted: " + names_of(general_keys()));
      }
    } catch (const std::invalid_argument& e) {
      r.fail(line, key, value, e.what());
    }
  }
  for (const TierConfig& t : c.tiers) {
    if (t.path.empty()) throw ConfigError(path + ": section [tier." + t.name + "] has no 'path'");
    if (!t.quota_bytes && !t.quota_percent)
      throw ConfigError(path + ": section [tier." + t.name + "] has no 'quota' (" + kQuotaAccepted +
                        ")");
  }
  if (c.tiers.empty())
    throw ConfigError(path + ": no node-local tier: add a section [tier.NAME] with path and quota");
  return c;
}

void override_tiers(Config& config, const std::vector<std::string>& specs) {
  if (specs.empty()) return;
  if (specs.size() > kMaxTiers)
    throw ConfigError("--tier: at most " + std::to_string(kMaxTiers) + " tiers");
  config.tiers.clear();
  for (const std::string& spec : specs) {
    TierConfig t{.name = "tier" + std::to_string(config.tiers.size())};
    size_t colon = spec.rfind(':');
    t.path = spec.substr(0, colon);
    std::string quota = colon == std::string::npos ? "100%" : spec.substr(colon + 1);
    try {
      apply(tier_keys(), "path", t.path, t);
      apply(tier_keys(), "quota", quota, t);
    } catch (const std::invalid_argument& e) {
      throw ConfigError("--tier '" + spec + "': " + e.what() + " (format DIR or DIR:QUOTA)");
    }
    config.tiers.push_back(t);
  }
}

std::string job_dir(const TierConfig& tier, const std::string& job) {
  std::string base = tier.path;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + "/monarch-" + job;
}

bool valid_job_key(std::string_view job) {
  if (job.empty() || job.size() > 64 || job[0] == '.') return false;
  for (char ch : job)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '-')
      return false;
  return true;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 5) bytes /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

// The dataset root as an absolute, lexically normal path, checked readable.
std::string check_dataset(const std::string& given, const Config& config) {
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
  char norm[kPathMax];
  if (normalize_path(cwd, given, norm, sizeof norm) < 0)
    throw ConfigError("--dataset '" + given + "': path too long");
  std::string root = norm;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  struct stat st;
  if (stat(root.c_str(), &st) != 0)
    throw ConfigError("--dataset " + root + ": " + std::string(std::strerror(errno)));
  if (!S_ISDIR(st.st_mode)) throw ConfigError("--dataset " + root + ": not a directory");
  if (access(root.c_str(), R_OK | X_OK) != 0)
    throw ConfigError("--dataset " + root + ": cannot list it (" +
                      std::string(std::strerror(errno)) + ")");
  if (root == "/") throw ConfigError("--dataset /: the root file system cannot be a dataset");
  char real[PATH_MAX];
  std::string real_root = realpath(root.c_str(), real) ? real : root;
  for (const TierConfig& t : config.tiers) {
    char tr[PATH_MAX];
    std::string tier_real = realpath(t.path.c_str(), tr) ? tr : t.path;
    auto inside = [](const std::string& a, const std::string& b) {
      return a == b ||
             (a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '/');
    };
    if (inside(real_root, tier_real) || inside(tier_real, real_root))
      throw ConfigError("--dataset " + root + " overlaps the node-local tier " + t.path +
                        ": the dataset must live on the shared file system");
  }
  return root;
}

}  // namespace monarch
