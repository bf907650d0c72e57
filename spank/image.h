// A job's space on a tier as a file system image (job_space = image): an
// ext4 file system made by mke2fs in <tier>/.monarch/images/<key>.img,
// fallocated to the tier's quota (or what the tier has free, if less),
// attached to a loop device and mounted at <tier>/monarch-<key> with nosuid
// and nodev, its root the user's with mode 0700. The quota then holds
// whatever the job writes there (ENOSPC), and the job's end is one detach
// and one rename whatever the job built inside. The image is made ready
// (lost+found gone, owner and mode set) while it is still a detached mount
// that only this process can reach, and only then moved into place.
#pragma once

#include <cstdint>
#include <string>

#include "process.h"
#include "tier.h"

namespace monarch::spank {

// The image's size: the tier's quota, capped by the tier's free space less
// 1% of its size. Throws TierError when that leaves less than 256 KiB.
uint64_t image_size(const Tier& tier);

// Makes, attaches and mounts the image of job `key` for `user`; returns the
// id of the mount now at <tier>/monarch-<key>. The caller holds the tier's
// lock and has made sure nothing is at that name. Throws TierError; what
// was made is left for release_space (job_space.h) to remove.
uint64_t make_image(const Tier& tier, const std::string& key, const User& user);

// "<key>.img", in images/.
std::string image_name(const std::string& key);

// Shuts the image's file system down (EXT4_IOC_SHUTDOWN, without flushing):
// what the job left unwritten is dropped, not written, so letting the
// detached mount go costs the same whatever the job wrote last.
void shut_down_image(int root_fd);

}  // namespace monarch::spank
