// Writing the report's files into a directory, safely where other users can
// write too (a shared report_dir): nothing is opened by a name another user
// could have made, no link is followed, nothing of another user's is
// replaced. The files are made (O_EXCL, mode 0666 less the caller's umask)
// in a private directory made for them, then renamed into place.
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "config.h"
#include "fd.h"
#include "report.h"

namespace monarch {
namespace {

constexpr mode_t kFileMode = 0666;  // less the umask: the user's choice
constexpr int kNameAttempts = 8;

std::string random_hex() {
  uint64_t v = 0;
  if (getrandom(&v, sizeof v, GRND_NONBLOCK) != sizeof v)
    v = (uint64_t(getpid()) << 32) ^ uint64_t(time(nullptr));
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

[[noreturn]] void fail(const std::string& path, int err) {
  throw std::runtime_error("cannot write " + path + ": " + std::strerror(err));
}

void write_new(int dirfd, const std::string& name, const std::string& text,
               const std::string& shown) {
  Fd fd(
      openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, kFileMode));
  if (!fd) fail(shown, errno);
  for (size_t done = 0; done < text.size();) {
    ssize_t n = write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno != EINTR) fail(shown, errno);
    if (n > 0) done += size_t(n);
  }
  if (fsync(fd.get()) != 0) fail(shown, errno);
}

// A directory of the caller's, under a name nobody could have guessed,
// emptied and removed when it goes.
class PrivateDir {
 public:
  PrivateDir(int parent, const std::string& stem, const std::string& shown) : parent_(parent) {
    for (int i = 0; i < kNameAttempts && !fd_; ++i) {
      name_ = "." + stem + "." + random_hex();
      if (mkdirat(parent, name_.c_str(), 0700) != 0) {
        if (errno == EEXIST) continue;
        fail(shown, errno);
      }
      fd_ = Fd(openat(parent, name_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!fd_) fail(shown, errno);
    }
    if (!fd_) fail(shown, EEXIST);
  }
  ~PrivateDir() {
    for (const std::string& n : made_) unlinkat(fd_.get(), n.c_str(), 0);
    fd_.reset();
    unlinkat(parent_, name_.c_str(), AT_REMOVEDIR);
  }
  int get() const { return fd_.get(); }
  void made(const std::string& name) { made_.push_back(name); }

 private:
  int parent_;
  std::string name_;
  Fd fd_;
  std::vector<std::string> made_;
};

enum class Slot {
  kFree,   // nothing there
  kOurs,   // the caller's own regular file: may be replaced
  kTaken,  // anything else: left alone
};

Slot slot_of(int dirfd, const std::string& name) {
  struct stat st;
  if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return errno == ENOENT ? Slot::kFree : Slot::kTaken;
  return S_ISREG(st.st_mode) && st.st_uid == geteuid() ? Slot::kOurs : Slot::kTaken;
}

// The host named in the caller's own report at `name`; "" when it cannot
// tell (then the file is the caller's to replace).
std::string host_of(int dirfd, const std::string& name) {
  Fd fd(openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st;
  if (!fd || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      size_t(st.st_size) > kMaxStatsBytes)
    return "";
  std::string text(size_t(st.st_size), '\0');
  if (pread(fd.get(), text.data(), text.size(), 0) != ssize_t(text.size())) return "";
  try {
    return figures(text).host;
  } catch (const std::exception&) {
    return "";
  }
}

// Moves `from` (in the private directory) to `to`, replacing only the
// caller's own file, and only while `still_usable()` says so: a name found
// taken is judged again, as another writer (another node of the job, the
// same user) may have placed it since the caller looked. False when `to`
// may not be replaced.
template <class Recheck>
bool place(int priv, const std::string& from, int dirfd, const std::string& to,
           const std::string& shown, Recheck still_usable) {
  if (renameat2(priv, from.c_str(), dirfd, to.c_str(), RENAME_NOREPLACE) == 0) return true;
  if (errno != EEXIST) fail(shown, errno);
  if (slot_of(dirfd, to) != Slot::kOurs || !still_usable()) return false;
  if (renameat(priv, from.c_str(), dirfd, to.c_str()) != 0) fail(shown, errno);
  return true;
}

struct File {
  std::string suffix, text;
};

bool is_link(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

// Writes `files` as <base><suffix> for the first usable base of `bases`.
// `usable` says whether a base may be used; placing can still find a name
// taken meanwhile, and then the next base is tried.
template <class Usable>
std::vector<std::string> write_files(const std::string& dir, const std::string& stem,
                                     const std::vector<std::string>& bases,
                                     const std::vector<File>& files, Usable usable) {
  std::string shown = "reports into " + dir;
  // The directory itself, never a link to it: one put in its place during the
  // job would send the reports wherever it points.
  Fd dirfd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dirfd && (errno == ELOOP || errno == ENOTDIR) && is_link(dir))
    throw std::runtime_error("cannot write " + shown +
                             ": it is a symbolic link; reports go only into the directory itself");
  if (!dirfd) throw std::runtime_error("cannot write " + shown + ": " + std::strerror(errno));
  PrivateDir priv(dirfd.get(), stem, shown);
  for (const File& f : files) {
    write_new(priv.get(), "report" + f.suffix, f.text, shown);
    priv.made("report" + f.suffix);
  }
  for (const std::string& base : bases) {
    if (!usable(dirfd.get(), base)) continue;
    std::vector<std::string> paths;
    bool placed = true;
    for (const File& f : files) {
      placed = place(priv.get(), "report" + f.suffix, dirfd.get(), base + f.suffix,
                     dir + "/" + base + f.suffix, [&] { return usable(dirfd.get(), base); });
      if (!placed) break;
      paths.push_back(dir + "/" + base + f.suffix);
    }
    if (placed) return paths;
    if (!paths.empty())  // a later name was taken meanwhile: unusable for good
      throw std::runtime_error("cannot write " + dir + "/" + base + ": a name was taken meanwhile");
  }
  throw std::runtime_error("cannot write " + shown +
                           ": the report's names are taken by another "
                           "user");
}

bool free_or_ours(int dirfd, const std::string& name) {
  return slot_of(dirfd, name) != Slot::kTaken;
}

}  // namespace

void write_atomically(const std::string& path, const std::string& text) {
  static std::atomic<unsigned> serial{0};
  std::string tmp = path + ".tmp." + random_hex() + "." + std::to_string(serial++);
  // O_EXCL: a name nobody else made, so no link planted there is followed or truncated.
  Fd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, kFileMode));
  int err = fd ? 0 : errno;
  for (size_t done = 0; !err && done < text.size();) {
    ssize_t n = write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno != EINTR) err = errno;
    if (n > 0) done += size_t(n);
  }
  if (!err && fsync(fd.get()) != 0) err = errno;
  if (fd && close(fd.release()) != 0 && !err) err = errno;
  if (!err && rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (!err) return;
  unlink(tmp.c_str());
  fail(path, err);
}

std::vector<std::string> write_reports(const std::string& json, const std::string& dir) {
  Figures f = figures(json);
  if (!valid_job_key(f.job)) throw ReportError("a job key that cannot name a file: " + f.job);
  std::string host = valid_job_key(f.host) ? f.host : "";
  // The .json first: it names the host, so that a node placing its files
  // second sees whose they are (the nodes of a job write at the same moment).
  std::vector<File> files = {
      {".json", report_json(json)}, {".txt", summary_text(json)}, {".svg", report_svg(json)}};
  std::string base = "monarch-" + f.job;
  std::vector<std::string> bases{base};
  if (!host.empty()) bases.push_back(base + "-" + host);
  bases.push_back(base + "-" + (host.empty() ? "" : host + "-") + random_hex());
  // The first node of a job gets the plain names; a rerun on the same host
  // replaces its own; another host's report is kept.
  std::vector<std::string> paths =
      write_files(dir, "monarch-" + f.job, bases, files, [&](int dirfd, const std::string& b) {
        Slot json_slot = slot_of(dirfd, b + ".json");
        if (json_slot == Slot::kTaken) return false;
        if (json_slot == Slot::kOurs && b == base) {
          std::string other = host_of(dirfd, b + ".json");
          if (!other.empty() && other != host) return false;
        }
        return free_or_ours(dirfd, b + ".txt") && free_or_ours(dirfd, b + ".svg");
      });
  std::swap(paths.at(0), paths.at(1));  // listed as before: .txt, .json, .svg
  return paths;
}

std::string write_note(const std::string& job, const std::string& line, const std::string& dir) {
  if (!valid_job_key(job)) throw ReportError("a job key that cannot name a file: " + job);
  std::string base = "monarch-" + job;
  return write_files(
             dir, base, {base, base + "-" + random_hex()}, {{".txt", line + "\n"}},
             [](int dirfd, const std::string& b) { return free_or_ours(dirfd, b + ".txt"); })
      .at(0);
}

}  // namespace monarch
