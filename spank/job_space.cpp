#include "job_space.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "image.h"
#include "mounts.h"
#include "trash.h"

namespace monarch::spank {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

// Is the space there as the record says? Looks at the tier's side only
// (the kernel's cached attributes), never into the space.
bool as_recorded(const Tier& tier, const JobRecord& r) {
  std::string name = space_name(r.key);
  if (r.space == JobSpace::kImage)
    return r.mount_id && mount_id_at(tier.root.get(), name.c_str()) == r.mount_id;
  struct statx sx;
  if (statx(tier.root.get(), name.c_str(), AT_SYMLINK_NOFOLLOW | AT_STATX_DONT_SYNC,
            STATX_TYPE | STATX_UID | STATX_MNT_ID, &sx) != 0)
    return false;
  return S_ISDIR(sx.stx_mode) && sx.stx_uid == r.uid &&
         sx.stx_mnt_id == mount_id_at(tier.root.get(), "");
}

void make_directory(const Tier& tier, const std::string& key, const User& user) {
  std::string name = space_name(key), path = tier.root_path + "/" + name;
  if (mkdirat(tier.root.get(), name.c_str(), 0700) != 0)
    throw TierError("cannot create " + path + ": " + errno_text());
  Fd dir(openat(tier.root.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir || fchown(dir.get(), user.uid, user.gid) != 0 || fchmod(dir.get(), 0700) != 0)
    throw TierError("cannot give " + path + " to the job's user: " + errno_text());
}

}  // namespace

void prepare_space(const Tier& tier, const JobRecord& want, const User& user) {
  std::string name = space_name(want.key), path = tier.root_path + "/" + name;
  if (std::optional<JobRecord> had = read_record(tier.jobs.get(), want.key)) {
    bool same_run = had->boot == want.boot && had->uid == want.uid &&
                    had->restarts == want.restarts && had->space == want.space;
    if (same_run && as_recorded(tier, *had)) return;  // made by an earlier step of this run
    // The job itself changed it (a mount on it): its end releases it.
    if (same_run)
      throw TierError(path +
                      " is not as Monarch made it (something is mounted on it, or it "
                      "was replaced)");
    // Of an earlier run of this job id (a requeue, a crash), or damaged.
    Release r = release_space(tier, *had);
    if (!r.problem.empty())
      throw TierError("an earlier " + path + " could not be removed: " + r.problem);
  }
  struct stat st;
  if (fstatat(tier.root.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
    throw TierError(path + " is there and Monarch has no record of making it: remove it");
  if (errno != ENOENT) throw TierError("cannot check " + path + ": " + errno_text());

  JobRecord record = want;
  record.mount_id = 0;
  write_record(tier.jobs.get(), record);
  try {
    if (want.space == JobSpace::kImage) {
      record.mount_id = make_image(tier, want.key, user);
      write_record(tier.jobs.get(), record);
    } else {
      make_directory(tier, want.key, user);
    }
  } catch (...) {
    release_space(tier, record);
    throw;
  }
}

Release release_space(const Tier& tier, const JobRecord& record) {
  Release out;
  std::string name = space_name(record.key), path = tier.root_path + "/" + name;
  DetachResult d =
      detach_mounts(tier.root.get(), tier.root_path, name, record.mount_id, &out.image);
  if (out.image) shut_down_image(out.image.get());
  out.mounts = d.found;
  if (d.failed) {
    out.problem = "cannot detach a mount at or below " + path + ": " + std::strerror(d.first_errno);
    return out;
  }
  if (uint64_t here = mount_id_at(tier.root.get(), name.c_str())) {  // 0: nothing there
    if (here != mount_id_at(tier.root.get(), "")) {
      out.problem = path + " is still a mount point";
      return out;
    }
    // An image's mount point is an empty directory of root's; anything
    // else goes to the trash whole.
    if (record.space == JobSpace::kImage &&
        unlinkat(tier.root.get(), name.c_str(), AT_REMOVEDIR) == 0) {
    } else if (move_to_trash(tier.root.get(), name, tier.trash.get())) {
      out.moved = true;
    } else {
      out.problem = "cannot move " + path + " to " + tier.trash_path + ": " + errno_text();
    }
  }
  std::string image = image_name(record.key);
  if (!move_to_trash(tier.images.get(), image, tier.trash.get()) && errno != ENOENT &&
      out.problem.empty())
    out.problem = "cannot move the image " + image + " to " + tier.trash_path + ": " + errno_text();
  if (out.problem.empty()) remove_record(tier.jobs.get(), record.key);
  return out;
}

}  // namespace monarch::spank
