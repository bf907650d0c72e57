#include "report.h"

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <cstdio>
#include <sstream>

#include "config.h"
#include "stats.h"

namespace monarch {
namespace pt = boost::property_tree;

namespace {

pt::ptree parse(const std::string& json) {
  pt::ptree t;
  try {
    std::istringstream in(json);
    pt::read_json(in, t);
  } catch (const pt::json_parser_error& e) {
    throw ReportError(std::string("not valid JSON (") + e.message() + " at line " +
                      std::to_string(e.line()) + ")");
  }
  if (t.get<std::string>("schema", "") != kStatsSchema)
    throw ReportError(std::string("not Monarch statistics (expected schema ") + kStatsSchema + ")");
  return t;
}

double sum(const pt::ptree& t, const std::string& key) {
  double s = 0;
  if (auto c = t.get_child_optional(key)) {
    if (c->empty()) return c->get_value<double>(0);
    for (auto& [k, v] : *c) s += v.get_value<double>(0);
  }
  return s;
}

std::string pct(double part, double whole) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", whole > 0 ? 100 * part / whole : 0.0);
  return b;
}

}  // namespace

std::string summary_text(const std::string& json) {
  pt::ptree t = parse(json);
  std::ostringstream o;
  const pt::ptree& tot = t.get_child("totals");
  double opens = tot.get<double>("opens", 0), bytes = tot.get<double>("bytes", 0);
  double local = sum(tot, "tier_bytes");
  double pfs_bytes = tot.get<double>("pfs_bytes", 0) + tot.get<double>("stager.pfs_bytes", 0);
  double pfs_opens = tot.get<double>("pfs_opens", 0) + tot.get<double>("stager.pfs_opens", 0);
  o << "monarch: job " << t.get<std::string>("job", "?") << ", dataset "
    << t.get<std::string>("dataset", "?") << (t.get<bool>("complete", false) ? "" : " (incomplete)")
    << "\n";
  o << "  read " << human_bytes(bytes) << " in " << opens << " opens; " << pct(local, bytes)
    << " from node-local tiers\n";
  o << "  PFS: " << pfs_opens << " opens, " << human_bytes(pfs_bytes) << " read ("
    << pct(pfs_bytes, bytes) << " of what the job read)\n";
  int n = 0;
  for (auto& [k, e] : t.get_child("epochs")) {
    const pt::ptree& c = e.get_child("counters");
    double b = c.get<double>("bytes", 0);
    o << "  epoch " << ++n << (e.get<bool>("complete", false) ? "" : " (partial)") << ": "
      << e.get<double>("end_s", 0) - e.get<double>("start_s", 0) << " s, local "
      << pct(sum(c, "tier_bytes"), b) << ", PFS reads "
      << c.get<double>("pfs_reads", 0) + c.get<double>("stager.pfs_reads", 0) << "\n";
  }
  return o.str();
}

}  // namespace monarch
