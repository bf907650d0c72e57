#include "job_space.h"

#include <fcntl.h>
#include <sys/mount.h>
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

// Is the space there as the record says: its own mount on top? Looks at the
// tier's side only, never into the space.
bool as_recorded(const Tier& tier, const JobRecord& r) {
  return r.mount_id && mount_id_at(tier.root.get(), space_name(r.key).c_str()) == r.mount_id;
}

// The job's directory, bound on itself before the user can reach it (a
// root's directory, mode 0700, until then): a mount of its own, whose one
// lazy detach at the job's end takes along whatever the job mounted inside
// (mounts.h). Private, so that a mount made inside propagates nowhere (a
// bind mount is otherwise a peer of the tier's own mount, which would get a
// copy of it, hidden below). nosuid and nodev, as an image is. Returns the
// id of the mount now at <tier>/monarch-<key>.
uint64_t make_directory(const Tier& tier, const std::string& key, const User& user) {
  std::string name = space_name(key), path = tier.root_path + "/" + name;
  if (mkdirat(tier.root.get(), name.c_str(), 0700) != 0)
    throw TierError("cannot create " + path + ": " + errno_text());
  Fd tree(open_tree(tier.root.get(), name.c_str(),
                    OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW));
  struct mount_attr attr = {};
  attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
  attr.propagation = MS_PRIVATE;
  if (!tree ||
      move_mount(tree.get(), "", tier.root.get(), name.c_str(), MOVE_MOUNT_F_EMPTY_PATH) != 0 ||
      mount_setattr(tree.get(), "", AT_EMPTY_PATH, &attr, sizeof attr) != 0)
    throw TierError("cannot mount " + path + " on itself: " + errno_text());
  Fd dir(openat(tree.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir || fchown(dir.get(), user.uid, user.gid) != 0 || fchmod(dir.get(), 0700) != 0)
    throw TierError("cannot give " + path + " to the job's user: " + errno_text());
  return mount_id_at(tier.root.get(), name.c_str());
}

// Whether `a` and `b` are on one file system.
bool same_file_system(int a, int b) {
  struct stat sa, sb;
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev;
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
    // Of an earlier run of this job id (a requeue, a crash), or damaged;
    // never while a step of that run still holds it (a stuck slurmstepd on a
    // node that shares the tiers): its end or a later sweep releases it.
    if (record_held(tier.jobs.get(), want.key))
      throw TierError(path + " is still held by an earlier run of this job id");
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
    record.mount_id = want.space == JobSpace::kImage ? make_image(tier, want.key, user)
                                                     : make_directory(tier, want.key, user);
    write_record(tier.jobs.get(), record);
  } catch (...) {
    release_space(tier, record);
    throw;
  }
}

Release release_space(const Tier& tier, const JobRecord& record) {
  Release out;
  std::string name = space_name(record.key), path = tier.root_path + "/" + name;
  bool image = record.space == JobSpace::kImage;
  DetachResult d = detach_mounts(tier.root.get(), tier.root_path, name, record.mount_id,
                                 image ? &out.image : nullptr);
  // The image's own file system, never the tier's (were the recorded mount
  // id now another mount's).
  if (out.image && same_file_system(out.image.get(), tier.root.get())) out.image.reset();
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
    if (image && unlinkat(tier.root.get(), name.c_str(), AT_REMOVEDIR) == 0) {
    } else if (move_to_trash(tier.root.get(), name, tier.trash.get())) {
      out.moved = true;
    } else {
      out.problem = "cannot move " + path + " to " + tier.trash_path + ": " + errno_text();
    }
  }
  std::string file = image_name(record.key);
  if (!move_to_trash(tier.images.get(), file, tier.trash.get()) && errno != ENOENT &&
      out.problem.empty())
    out.problem = "cannot move the image " + file + " to " + tier.trash_path + ": " + errno_text();
  if (out.problem.empty()) remove_record(tier.jobs.get(), record.key);
  return out;
}

}  // namespace monarch::spank
