// Shared by report.cpp, report_text.cpp and report_svg.cpp; not an API.
#pragma once

#include <boost/property_tree/ptree.hpp>

#include <cstddef>
#include <string>

#include "report.h"

namespace monarch::report_internal {

// One counter of counters.h, from its X-macro: the enum value (Counter or
// StagerCounter), the name the statistics use, how many (4: one per tier).
struct CounterInfo {
  int id;
  const char* name;
  int count;
  const char* meaning;
};
extern const CounterInfo kProcessCounters[];
extern const size_t kNumProcessCounters;
extern const CounterInfo kStagerCounters[];  // indexed by StagerCounter

// Keys in a counters object: "fb_wait", "stager.noroom".
std::string pkey(int counter);
std::string skey(int stager_counter);

std::string fmt(const char* printf_format, double v);
std::string pct(double part, double whole);  // "12.5%", "-" when whole is 0
std::string rate(double bytes_per_s);        // "1.5 GiB/s", "unknown" when 0
std::string count(double v);                 // "12"

// Statistics, parsed and as their original text (the whole input, or a
// report's "stats" member), for embedding unchanged.
struct Parsed {
  boost::property_tree::ptree stats;
  std::string raw;
};
// Accepts monarch-stats/1 or monarch-report/1. Throws ReportError.
Parsed parse(const std::string& json);

// The text of the top-level member `key` of a JSON object already parsed
// successfully; "" when absent.
std::string member_text(const std::string& json, const std::string& key);

}  // namespace monarch::report_internal

namespace monarch {
// The figures of parsed statistics. Throws boost::property_tree::ptree_error.
Figures figures_of(const boost::property_tree::ptree& stats);
}  // namespace monarch
