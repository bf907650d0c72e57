#include "job_key.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "fd.h"

namespace monarch::spank {
namespace {

constexpr size_t kMinSecret = 32;
constexpr size_t kMaxSecret = 64 << 10;
constexpr uid_t kMaxSystemUid = 999;  // SYS_UID_MAX of Debian's and Red Hat's login.defs

std::string read_secret(const std::string& path, uid_t job_uid) {
  auto bad = [&path](const std::string& why) {
    return JobKeyError("job_key_secret " + path + ": " + why +
                       "; the job's nodes cache on their own (give every node the same file, "
                       "readable by root alone: monarch.conf(5))");
  };
  Fd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd) throw bad(std::strerror(errno));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) throw bad(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw bad("not a regular file");
  if (st.st_mode & 077) throw bad("its group or others may read or write it");
  // Root's, or a system account's (munge's): never a user's, who could
  // compute every job's key.
  if (st.st_uid == job_uid || st.st_uid > kMaxSystemUid)
    throw bad("owned by uid " + std::to_string(st.st_uid) + ", not root or a system account");
  if (st.st_size < off_t(kMinSecret) || st.st_size > off_t(kMaxSecret))
    throw bad("holds " + std::to_string(st.st_size) + " bytes, not 32 to 65536");
  std::string secret(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < secret.size()) {
    ssize_t n = read(fd.get(), secret.data() + got, secret.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw bad(n < 0 ? std::strerror(errno) : "shorter than it said");
    got += size_t(n);
  }
  return secret;
}

// HMAC-SHA256(secret, label, job, uid, restarts), the integers little-endian.
std::string mac(const std::string& secret, std::string_view label, uint32_t job, uid_t uid,
                uint32_t restarts) {
  std::string data(label);
  for (uint32_t v : {job, uint32_t(uid), restarts})
    for (int i = 0; i < 4; ++i) data += char((v >> (8 * i)) & 0xff);
  unsigned char out[32];
  size_t length = 0;
  if (!EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, secret.data(), secret.size(),
                 reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, sizeof out,
                 &length) ||
      length != sizeof out)
    throw JobKeyError("HMAC-SHA256 (OpenSSL) failed: the job's nodes cache on their own");
  return std::string(reinterpret_cast<char*>(out), sizeof out);
}

}  // namespace

JobKey derive_job_key(const Config& config, uint32_t job, uid_t uid, uint32_t restarts) {
  std::string secret = read_secret(config.job_key_secret, uid);
  std::string key = mac(secret, "monarch-job-key-v1", job, uid, restarts);
  explicit_bzero(secret.data(), secret.size());
  JobKey out;
  static const char kHex[] = "0123456789abcdef";
  for (unsigned char c : key) out.secret += {kHex[c >> 4], kHex[c & 15]};
  return out;
}

}  // namespace monarch::spank
