// A tier as the plugin uses it for Slurm jobs. Its directory must be root's
// and writable by nobody else: then no user can create, rename or replace
// anything in it, and <tier>/monarch-<key> is what the plugin made. A tier
// that is world- or group-writable, or not root's, is refused (Monarch is
// off for the job, the job runs). Monarch's own state on the tier lives in
// <tier>/.monarch (root, 0700): jobs/ (the records, record.h), images/ (the
// jobs' file system images, image.h) and trash/ (trash.h). Everything is
// reached through descriptors opened here, never again by path.
#pragma once

#include <stdexcept>
#include <string>

#include "config.h"
#include "fd.h"

namespace monarch::spank {

struct TierError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Tier {
  const TierConfig* config = nullptr;
  Fd root;   // the tier directory
  Fd state;  // .monarch: absent (no descriptor) when Monarch never used the tier
  Fd jobs, images, trash;
  std::string root_path;  // as the kernel names it (for mount points), e.g. /var/tmp/tier
  std::string trash_path;

  bool has_state() const { return bool(state); }
};

// Opens and checks the tier; with `create`, makes .monarch and its
// subdirectories when missing. Throws TierError with a line for the admin.
Tier open_tier(const TierConfig& config, bool create);

// The tier's lock (a flock on .monarch), held by the plugin's root code
// while it makes, checks or removes a job's space: bounded work only.
// Waits at most `timeout_s` for it, then throws TierError.
class TierLock {
 public:
  TierLock(const Tier& tier, unsigned timeout_s);
  ~TierLock();
  TierLock(const TierLock&) = delete;
  TierLock& operator=(const TierLock&) = delete;

 private:
  int fd_;
};

// "monarch-<key>": the job's directory (or mount point) in the tier.
std::string space_name(const std::string& key);

}  // namespace monarch::spank
