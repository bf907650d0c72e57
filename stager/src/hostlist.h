// A Slurm node list (SLURM_JOB_NODELIST) expanded to node names, in Slurm's
// order: "n[1-3,07],gpu[01-02]a" is n1 n2 n3 n07 gpu01a gpu02a. Ranges keep
// their zero padding; several bracket groups in one name multiply out.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace monarch {

inline constexpr size_t kMaxJobNodes = 65536;

// Throws std::invalid_argument naming the list and what is wrong with it
// (unbalanced brackets, a bad range, more than kMaxJobNodes names).
std::vector<std::string> expand_hostlist(std::string_view list);

// The name of the node with Slurm's relative id `nodeid` (S_JOB_NODEID) in a
// step's node list: its `nodeid`-th name. "" when the list has no such
// name or is not a node list.
std::string node_name(std::string_view nodelist, uint32_t nodeid);

}  // namespace monarch
