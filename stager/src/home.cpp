#include "home.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>
#include <stdexcept>
#include <unordered_set>

namespace monarch {
namespace {

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// splitmix64's finalizer: spreads a 64-bit value over all bits, so that
// nearby inputs give independent scores.
uint64_t mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Homes::Homes(std::vector<Node> nodes) : nodes_(std::move(nodes)) {
  std::unordered_set<std::string> seen;
  for (const Node& n : nodes_) {
    if (n.name.empty()) throw std::invalid_argument("a node of the job has an empty name");
    if (!seen.insert(n.name).second)
      throw std::invalid_argument("node '" + n.name + "' is listed twice in the job's nodes");
    if (!(n.weight > 0) || !std::isfinite(n.weight))
      throw std::invalid_argument("node '" + n.name + "' has weight " + std::to_string(n.weight) +
                                  ": a node's weight (its cache's bytes) must be above 0");
    seeds_.push_back(mix(fnv1a(n.name)));
  }
}

uint64_t Homes::hash(std::string_view s) {
  return fnv1a(s);
}

double Homes::score(uint64_t path_hash, int node) const {
  // A uniform u in (0, 1) from the pair; -w / ln(u) has the distribution
  // under which the largest of several picks node i with probability
  // w_i / sum(w) (Schindelhauer and Schomaker's weighted rendezvous).
  uint64_t r = mix(path_hash ^ seeds_[node]);
  double u = (double(r >> 11) + 0.5) * 0x1p-53;
  return -nodes_[node].weight / std::log(u);
}

std::vector<uint16_t> balance_homes(const std::vector<uint64_t>& sizes, int nodes) {
  std::vector<uint32_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return sizes[a] > sizes[b]; });
  using Load = std::pair<uint64_t, int>;  // bytes so far, node
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> least;
  for (int n = 0; n < nodes; ++n) least.push({0, n});
  std::vector<uint16_t> home(sizes.size());
  for (uint32_t f : order) {
    auto [bytes, n] = least.top();
    least.pop();
    home[f] = uint16_t(n);
    least.push({bytes + sizes[f], n});
  }
  return home;
}

}  // namespace monarch
