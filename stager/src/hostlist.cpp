#include "hostlist.h"

#include <stdexcept>

namespace monarch {
namespace {

[[noreturn]] void bad(std::string_view list, const std::string& why) {
  throw std::invalid_argument("node list '" + std::string(list) + "': " + why);
}

bool digits(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Appends every name `item` (one comma-free element, brackets included) stands for.
void expand(std::string_view list, std::string_view item, std::vector<std::string>& out) {
  size_t open = item.find('[');
  if (open == std::string_view::npos) {
    if (item.find(']') != std::string_view::npos) bad(list, "a ']' without its '['");
    if (item.empty()) bad(list, "an empty name");
    if (out.size() >= kMaxJobNodes)
      bad(list, "more than " + std::to_string(kMaxJobNodes) + " nodes");
    out.emplace_back(item);
    return;
  }
  size_t close = item.find(']', open);
  if (close == std::string_view::npos) bad(list, "a '[' without its ']'");
  std::string_view prefix = item.substr(0, open), ranges = item.substr(open + 1, close - open - 1),
                   rest = item.substr(close + 1);
  if (ranges.find('[') != std::string_view::npos) bad(list, "nested brackets");
  while (true) {
    size_t comma = ranges.find(',');
    std::string_view r = ranges.substr(0, comma);
    size_t dash = r.find('-');
    std::string_view lo = r.substr(0, dash),
                     hi = dash == std::string_view::npos ? lo : r.substr(dash + 1);
    if (!digits(lo) || !digits(hi)) bad(list, "'" + std::string(r) + "' is not a range of numbers");
    unsigned long a = std::stoul(std::string(lo)), b = std::stoul(std::string(hi));
    if (b < a) bad(list, "the range '" + std::string(r) + "' goes down");
    for (unsigned long n = a; n <= b; ++n) {
      std::string num = std::to_string(n);
      if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');
      expand(list, std::string(prefix) + num + std::string(rest), out);
    }
    if (comma == std::string_view::npos) break;
    ranges.remove_prefix(comma + 1);
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    char c = i < list.size() ? list[i] : ',';
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth < 0) bad(list, "a ']' without its '['");
    if (c == ',' && depth == 0) {
      expand(list, list.substr(start, i - start), out);
      start = i + 1;
    }
  }
  if (depth != 0) bad(list, "a '[' without its ']'");
  return out;
}

std::string node_name(std::string_view nodelist, uint32_t nodeid) {
  try {
    std::vector<std::string> names = expand_hostlist(nodelist);
    return nodeid < names.size() ? names[nodeid] : "";
  } catch (const std::invalid_argument&) {
    return "";
  }
}

}  // namespace monarch
