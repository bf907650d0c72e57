#include <gtest/gtest.h>

#include <stdexcept>

#include "hostlist.h"

namespace monarch {
namespace {

using V = std::vector<std::string>;

TEST(Hostlist, SlurmsForms) {
  EXPECT_EQ(expand_hostlist("node1"), V{"node1"});
  EXPECT_EQ(expand_hostlist("n[1-3]"), (V{"n1", "n2", "n3"}));
  EXPECT_EQ(expand_hostlist("n[1-2,07],gpu[01-02]a"), (V{"n1", "n2", "n07", "gpu01a", "gpu02a"}));
  EXPECT_EQ(expand_hostlist("a,b[9-10]"), (V{"a", "b9", "b10"}));
  EXPECT_EQ(expand_hostlist("r[1-2]n[1-2]"), (V{"r1n1", "r1n2", "r2n1", "r2n2"}));
}

std::string error_of(const char* list) {
  try {
    expand_hostlist(list);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Hostlist, BadListsSayWhatIsWrong) {
  EXPECT_EQ(error_of("n[1-3"), "node list 'n[1-3': a '[' without its ']'");
  EXPECT_EQ(error_of("n1-3]"), "node list 'n1-3]': a ']' without its '['");
  EXPECT_EQ(error_of("n[3-1]"), "node list 'n[3-1]': the range '3-1' goes down");
  EXPECT_EQ(error_of("n[a-b]"), "node list 'n[a-b]': 'a-b' is not a range of numbers");
  EXPECT_EQ(error_of("a,,b"), "node list 'a,,b': an empty name");
  EXPECT_EQ(error_of("n[0-99999]"), "node list 'n[0-99999]': more than 65536 nodes");
}

// A node's name from a step's node list and Slurm's relative id of the node.
TEST(Hostlist, NodeNameIsTheNameAtTheNodesId) {
  EXPECT_EQ(node_name("node1", 0), "node1");
  EXPECT_EQ(node_name("n[1-3]", 2), "n3");
  EXPECT_EQ(node_name("n[08-11]", 1), "n09") << "zero padding kept";
  EXPECT_EQ(node_name("n[08-11]", 2), "n10");
  EXPECT_EQ(node_name("n[001-002,010]", 2), "n010");
  EXPECT_EQ(node_name("n[1-2,07],gpu[01-02]a", 3), "gpu01a");
  EXPECT_EQ(node_name("login,r[1-2]n[1-2]", 4), "r2n2");
  EXPECT_EQ(node_name("n[1-3]", 3), "") << "past the list's end";
  EXPECT_EQ(node_name("", 0), "");
  EXPECT_EQ(node_name("n[1-3", 0), "") << "not a node list";
}

}  // namespace
}  // namespace monarch
