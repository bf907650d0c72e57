#include <gtest/gtest.h>

#include "jobmap.h"

namespace monarch {
namespace {

std::string norm(std::string_view base, std::string_view path) {
  char out[kPathMax];
  int n = normalize_path(base, path, out, sizeof out);
  return n < 0 ? "(too long)" : std::string(out, n);
}

TEST(Paths, Normalize) {
  EXPECT_EQ(norm("", "/a/b/c"), "/a/b/c");
  EXPECT_EQ(norm("", "/a//b/./c"), "/a/b/c");
  EXPECT_EQ(norm("", "/a/b/../c"), "/a/c");
  EXPECT_EQ(norm("", "/a/../../c"), "/c");
  EXPECT_EQ(norm("", "/.."), "/");
  EXPECT_EQ(norm("/data/set", "x/y"), "/data/set/x/y");
  EXPECT_EQ(norm("/data/set", "../set/x"), "/data/set/x");
  EXPECT_EQ(norm("/data/set", "/abs"), "/abs");
  EXPECT_EQ(norm("/data", "file/"), "/data/file/");  // keeps ENOTDIR semantics
  EXPECT_EQ(norm("", std::string(2000, 'a')), "(too long)");
}

}  // namespace
}  // namespace monarch
