// Home nodes (issue 9): which node of a multi-node job copies a file from the
// PFS, once per job. Weighted rendezvous hashing (highest random weight): each
// (file, node) pair gets a pseudo-random score from both names, scaled by the
// node's weight (its tier capacity); the file's home is the node with the
// highest score. Hence:
//   - every node computes the same homes from the same node list, in any order,
//     with no message exchanged;
//   - a node's share of the files' bytes follows its weight;
//   - a node that is missing or has failed moves only the files homed on it,
//     each to the node that scores next (home(path, excluded)); no other file moves.
// Rendezvous hashing balances the files' count, not their bytes: with few
// large files (shards) one node's share can be much larger than another's.
// balance_homes() gives the first homes instead, by bytes: every node
// computes the same from the job's one index. Rendezvous then only re-homes
// the files of a node that failed.
// Pure logic: names and weights in, node numbers out.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace monarch {

class Homes {
 public:
  struct Node {
    std::string name;  // the node's name in the job's node list (Slurm's)
    double weight;     // its share of the job's cache, e.g. its tiers' bytes; > 0
  };
  // Throws std::invalid_argument naming the node when a weight is not > 0 or
  // a name is empty or repeated.
  explicit Homes(std::vector<Node> nodes);

  int nodes() const { return int(nodes_.size()); }
  const Node& node(int i) const { return nodes_[i]; }

  // The home of the file at `path` (relative to the dataset root): an index
  // into the node list. `excluded(i)`: node i must not be the home (a failed
  // peer); -1 when every node is excluded.
  template <typename Excluded>
  int home(std::string_view path, Excluded excluded) const;
  int home(std::string_view path) const {
    return home(path, [](int) { return false; });
  }

 private:
  std::vector<Node> nodes_;
  std::vector<uint64_t> seeds_;  // a hash of each node's name
  static uint64_t hash(std::string_view s);
  double score(uint64_t path_hash, int node) const;
};

// The first home of each file (`sizes`, in the index's order) among `nodes`
// nodes: the largest files first, each to the node with the fewest bytes so
// far (the lowest-numbered on a tie). Every node's share is within the
// largest file of every other's.
std::vector<uint16_t> balance_homes(const std::vector<uint64_t>& sizes, int nodes);

template <typename Excluded>
int Homes::home(std::string_view path, Excluded excluded) const {
  uint64_t h = hash(path);
  int best = -1;
  double best_score = 0;
  for (int i = 0; i < int(nodes_.size()); ++i) {
    if (excluded(i)) continue;
    double s = score(h, i);
    if (best < 0 || s > best_score) best = i, best_score = s;
  }
  return best;
}

}  // namespace monarch
