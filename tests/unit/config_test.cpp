#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "config.h"

namespace monarch {
namespace {

std::string write_temp(const std::string& text) {
  char name[] = "/tmp/monarch-config-XXXXXX";
  int fd = mkstemp(name);
  close(fd);
  std::ofstream(name) << text;
  return name;
}

// The message of the ConfigError `text` provokes.
std::string error_of(const std::string& text) {
  std::string path = write_temp(text);
  try {
    load_config(path);
  } catch (const ConfigError& e) {
    unlink(path.c_str());
    std::string m = e.what();
    EXPECT_EQ(m.rfind(path, 0), 0u) << "message must start with the file: " << m;
    return m.substr(path.size());
  }
  unlink(path.c_str());
  return "(no error)";
}

TEST(Config, ReadsTiersInOrderWithDefaults) {
  std::string path = write_temp(
      "# comment\ncopy_threads = 6\nconsistency = open\n"
      "[tier.ram]\npath = /dev/shm/monarch\nquota = 2G\n"
      "[tier.ssd]\npath = /local/monarch\nquota = 80%\nblock_size = 1M\n");
  Config c = load_config(path);
  unlink(path.c_str());
  ASSERT_EQ(c.tiers.size(), 2u);
  EXPECT_EQ(c.tiers[0].name, "ram");
  EXPECT_EQ(c.tiers[0].quota_bytes, 2ull << 30);
  EXPECT_EQ(c.tiers[0].block_size, 4u << 20);  // default
  EXPECT_EQ(c.tiers[1].name, "ssd");
  EXPECT_EQ(c.tiers[1].quota_percent, 80);
  EXPECT_EQ(c.tiers[1].block_size, 1u << 20);
  EXPECT_EQ(c.copy_threads, 6u);
  EXPECT_EQ(c.consistency, Consistency::kOpen);
  EXPECT_TRUE(c.stage_ahead);
}

TEST(Config, UnknownKeyNamesLineKeyAndAcceptedKeys) {
  std::string m = error_of("[tier.ssd]\npath = /x\nqouta = 1G\n");
  EXPECT_EQ(m.substr(0, 3), ":3:") << m;
  EXPECT_NE(m.find("'tier.ssd.qouta'"), std::string::npos) << m;
  EXPECT_NE(m.find("path, quota, block_size"), std::string::npos) << m;
}

TEST(Config, BadValuesSayWhatIsAccepted) {
  EXPECT_NE(error_of("copy_threads = 0\n[tier.a]\npath=/a\nquota=1G\n")
                .find(":1: key 'copy_threads', value '0': accepted: a whole number from 1 to 256"),
            std::string::npos);
  EXPECT_NE(error_of("[tier.a]\npath=/a\nquota=150%\n").find(":3:"), std::string::npos);
  EXPECT_NE(error_of("[tier.a]\npath=/a\nquota=12X\n").find("accepted: a size such as 500G"),
            std::string::npos);
  EXPECT_NE(error_of("[tier.a]\npath=relative\nquota=1G\n").find("absolute path"),
            std::string::npos);
  EXPECT_NE(error_of("consistency = sometimes\n[tier.a]\npath=/a\nquota=1G\n")
                .find("accepted: job, open"),
            std::string::npos);
  EXPECT_NE(error_of("log_level = loud\n[tier.a]\npath=/a\nquota=1G\n").find(":1:"),
            std::string::npos);
}

TEST(Config, StructuralErrors) {
  EXPECT_NE(error_of("copy_threads = 2\n").find("no node-local tier"), std::string::npos);
  EXPECT_NE(error_of("[tier.a]\nquota=1G\n").find("[tier.a] has no 'path'"), std::string::npos);
  EXPECT_NE(error_of("[tier.a]\npath=/a\n").find("has no 'quota'"), std::string::npos);
  EXPECT_NE(error_of("[tier.a]\npath=/a\npath=/b\nquota=1G\n").find(":3: key 'tier.a.path'"),
            std::string::npos);
  EXPECT_NE(error_of("[other]\nx=1\n").find("unknown section"), std::string::npos);
  EXPECT_NE(error_of("[tier.a]\nthis line has no equals sign\n").find(":2:"), std::string::npos);
}

TEST(Config, MissingFileIsAClearError) {
  try {
    load_config("/nonexistent/monarch.conf");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/monarch.conf: cannot read"),
              std::string::npos);
  }
}

TEST(Config, Sizes) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("64K"), 64u << 10);
  EXPECT_EQ(parse_size("4M"), 4u << 20);
  EXPECT_EQ(parse_size("2G"), 2ull << 30);
  EXPECT_EQ(parse_size("1T"), 1ull << 40);
  EXPECT_EQ(parse_size("3GB"), 3ull << 30);
  EXPECT_THROW(parse_size("-1"), std::invalid_argument);
  EXPECT_THROW(parse_size("1Q"), std::invalid_argument);
  EXPECT_THROW(parse_size(""), std::invalid_argument);
  EXPECT_THROW(parse_size("99999999999999T"), std::invalid_argument);
}

TEST(Config, CommandLineTiers) {
  Config c;
  override_tiers(c, {"/a", "/b:10G", "/c:50%"});
  ASSERT_EQ(c.tiers.size(), 3u);
  EXPECT_EQ(c.tiers[0].quota_percent, 100);
  EXPECT_EQ(c.tiers[1].quota_bytes, 10ull << 30);
  EXPECT_EQ(c.tiers[2].quota_percent, 50);
  EXPECT_THROW(override_tiers(c, {"rel/dir"}), ConfigError);
  EXPECT_THROW(override_tiers(c, {"/a:lots"}), ConfigError);
  EXPECT_EQ(job_dir(c.tiers[1], "job7"), "/b/monarch-job7");
  EXPECT_TRUE(valid_job_key("job7"));
  EXPECT_FALSE(valid_job_key("../x"));
  EXPECT_FALSE(valid_job_key(""));
}

}  // namespace
}  // namespace monarch
