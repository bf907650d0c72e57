// The plugin's job record (spank/record.h): root reads it back at the job's
// end and acts on it, so only the canonical text of a record is accepted;
// anything else is damaged and trusted for nothing but its space. And the
// job's key (spank/job_key.h): one per job, from a secret only root reads.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>

#include "job_key.h"
#include "record.h"

namespace monarch::spank {
namespace {

JobRecord sample() {
  return JobRecord{.key = "job42",
                   .space = JobSpace::kImage,
                   .uid = 1000,
                   .gid = 1000,
                   .groups = {27, 1000},
                   .umask = 022,
                   .boot = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
                   .restarts = 2,
                   .mount_id = 1234};
}

void expect_same(const JobRecord& a, const JobRecord& b) {
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.space, b.space);
  EXPECT_EQ(a.uid, b.uid);
  EXPECT_EQ(a.gid, b.gid);
  EXPECT_EQ(a.groups, b.groups);
  EXPECT_EQ(a.umask, b.umask);
  EXPECT_EQ(a.boot, b.boot);
  EXPECT_EQ(a.restarts, b.restarts);
  EXPECT_EQ(a.mount_id, b.mount_id);
  EXPECT_EQ(a.damaged, b.damaged);
}

TEST(Record, RoundTrip) {
  JobRecord r = sample();
  expect_same(parse_record("job42", record_text(r)), r);
  r.space = JobSpace::kDirectory;
  r.umask = 077;
  r.mount_id = 0;
  expect_same(parse_record("job42", record_text(r)), r);
}

// What the attack of issue 23 wrote through HOME, and its relatives: each
// makes the record damaged, never a record of another identity.
TEST(Record, AnythingButTheCanonicalTextIsDamaged) {
  std::string good = record_text(sample());
  auto with = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  const std::string bad[] = {
      good + "uid=0\n",                                  // a repeated name, last one wins no more
      with("umask=0022\n", "umask=0022\nhome=/x\n"),     // an unknown name (v1's fields)
      with("uid=1000\n", "uid=0\n"),                     // root
      with("uid=1000\n", "uid=+1000\n"),                 // not digits only
      with("uid=1000\n", "uid=01000\n"),                 // a leading zero
      with("uid=1000\n", "uid= 1000\n"),                 // a space
      with("uid=1000\n", "uid=4294967295\n"),            // (uid_t)-1
      with("gid=1000\n", "gid=99999999999999999999\n"),  // out of range
      with("groups=27,1000\n", "groups=27,,1000\n"),     // an empty group
      with("groups=27,1000\n", "groups=27\n"),           // without the primary group
      with("umask=0022\n", "umask=0000\r\n"),            // a control character
      with("umask=0022\n", "umask=0088\n"),              // not octal
      with("boot=", "boot=x"),                           // not a boot id
      with("key=job42\n", "key=job43\n"),                // filed under another key
      with("version=2\n", "version=1\n"),                // another version
      with("mount_id=1234\n", ""),                       // a name missing
      good.substr(0, good.size() - 1),                   // cut short
      with("space=image\n", "space=image\x1b[2J\n"),     // an escape
      std::string(),                                     // empty
      with("uid=1000\ngid=1000\n", "gid=1000\nuid=1000\n"),  // another order
      good + "#" + std::string(64 << 10, 'x') + "\n",        // longer than a record can be
  };
  for (const std::string& text : bad) {
    JobRecord r = parse_record("job42", text);
    EXPECT_TRUE(r.damaged) << text;
    EXPECT_EQ(r.uid, 0u) << text;
    EXPECT_TRUE(r.groups.empty()) << text;
    EXPECT_EQ(r.boot, "") << text;
  }
  // A damaged record still says how its space was made, where it said so well.
  EXPECT_EQ(parse_record("job42", good + "junk\n").space, JobSpace::kImage);
}

TEST(Record, NeverWritesWhatWouldReadBackDamaged) {
  std::string dir = testing::TempDir() + "/record_test";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Fd jobs(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  JobRecord r = sample();
  write_record(jobs.get(), r);
  expect_same(*read_record(jobs.get(), "job42"), r);
  r.boot = "";  // a boot id that could not be read
  EXPECT_THROW(write_record(jobs.get(), r), std::runtime_error);
  r = sample();
  r.uid = 0;
  EXPECT_THROW(write_record(jobs.get(), r), std::runtime_error);
  expect_same(*read_record(jobs.get(), "job42"), sample());  // the good one stays
  std::filesystem::remove_all(dir);
}

// Random edits of a good record, with a fixed seed: the parser never fails
// otherwise than by saying "damaged", and what it accepts is, comments
// aside, exactly the text it would write for what it returns.
TEST(Record, FuzzAcceptsOnlyCanonicalText) {
  std::mt19937_64 rng(20261127);
  std::string good = record_text(sample());
  const std::string pieces[] = {"\n", "=", ",", "0", "uid", "groups=0", "#", "\r", "-1", "\0"};
  auto strip_comments = [](const std::string& text) {
    std::string out;
    for (size_t at = 0; at < text.size();) {
      size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size() - 1;
      if (text[at] != '#') out += text.substr(at, nl + 1 - at);
      at = nl + 1;
    }
    return out;
  };
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    std::string t = good;
    for (int edits = 1 + int(rng() % 3); edits > 0 && !t.empty(); --edits) {
      size_t at = rng() % t.size();
      switch (rng() % 5) {
        case 4: {  // two lines swapped
          size_t a = t.rfind('\n', at), b = t.find('\n', at);
          if (a == std::string::npos || b == std::string::npos) break;
          size_t c = t.find('\n', b + 1);
          if (c == std::string::npos) break;
          std::string first = t.substr(a + 1, b - a), second = t.substr(b + 1, c - b);
          t.replace(a + 1, c - a, second + first);
          break;
        }
        case 0:
          t[at] = char(rng());
          break;
        case 1:
          t.erase(at, 1 + rng() % 8);
          break;
        case 2:
          t.insert(at, pieces[rng() % std::size(pieces)]);
          break;
        case 3:
          t.insert(at, t.substr(rng() % t.size(), 1 + rng() % 16));
          break;
      }
    }
    JobRecord r = parse_record("job42", t);
    if (r.damaged) continue;
    ++accepted;
    ASSERT_NE(r.uid, 0u) << t;
    ASSERT_EQ(strip_comments(t), strip_comments(record_text(r))) << t;
  }
  EXPECT_GT(accepted, 0);  // edits of the comment line are accepted
}

class Key : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/job_key_test";
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    config_.job_key_secret = dir_ + "/secret";
    write_secret(std::string(1024, 'k'), 0600);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write_secret(const std::string& bytes, mode_t mode) {
    unlink(config_.job_key_secret.c_str());
    Fd fd(open(config_.job_key_secret.c_str(), O_WRONLY | O_CREAT | O_EXCL, mode));
    ASSERT_EQ(write(fd.get(), bytes.data(), bytes.size()), ssize_t(bytes.size()));
    fchmod(fd.get(), mode);
  }
  std::string dir_;
  Config config_;
};

TEST_F(Key, OnePerJobTheSameOnEveryNode) {
  JobKey a = derive_job_key(config_, 42, 1000, 0);
  EXPECT_EQ(a.secret.size(), 64u);
  EXPECT_EQ(a.secret, derive_job_key(config_, 42, 1000, 0).secret);  // another node, same job
  // Another secret, other keys.
  write_secret(std::string(1024, 'j'), 0600);
  EXPECT_NE(a.secret, derive_job_key(config_, 42, 1000, 0).secret);
}

TEST_F(Key, RefusesASecretOthersCouldKnow) {
  auto refused = [&](const std::string& why) {
    try {
      derive_job_key(config_, 42, 1000, 0);
      ADD_FAILURE() << "accepted: " << why;
    } catch (const JobKeyError& e) {
      EXPECT_NE(std::string(e.what()).find(config_.job_key_secret), std::string::npos) << e.what();
    }
  };
  write_secret(std::string(1024, 'k'), 0640);
  refused("group-readable");
  write_secret(std::string(16, 'k'), 0600);
  refused("too short");
  write_secret(std::string(1024, 'k'), 0600);
  ASSERT_EQ(chown(config_.job_key_secret.c_str(), 1000, 1000), 0);
  refused("owned by the job's user");
  ASSERT_EQ(chown(config_.job_key_secret.c_str(), 1234, 1234), 0);
  refused("owned by another user, who could compute every job's key");
  ASSERT_EQ(chown(config_.job_key_secret.c_str(), 101, 101), 0);  // munge's, say
  EXPECT_EQ(derive_job_key(config_, 42, 1000, 0).secret.size(), 64u);
  std::string real = config_.job_key_secret;
  config_.job_key_secret = dir_ + "/link";
  ASSERT_EQ(symlink(real.c_str(), config_.job_key_secret.c_str()), 0);
  refused("a symbolic link");
  config_.job_key_secret = dir_ + "/missing";
  refused("missing");
}

}  // namespace
}  // namespace monarch::spank
