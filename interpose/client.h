// What the processes of a job tell their stager, and the changes they make to
// the job map themselves (claims, stale marks). Requests are datagrams sent
// on a socket opened for the one call: Monarch keeps no descriptor open in
// the job's processes, so RLIMIT_NOFILE means what it means without Monarch.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>

#include "jobmap.h"
#include "protocol.h"

namespace monarch {

// Sends one request; never blocks. `fds` ride along as SCM_RIGHTS.
bool send(JobMap* m, Request type, uint32_t file, const int* fds = nullptr, int nfds = 0,
          uint64_t off = 0, uint64_t len = 0);

// Reads [off, off + len) of `file` into the caller's vector through the
// stager, from another node of the job (Request::kPeerRead). Returns the
// bytes read (the file may end first), -1 and errno when the vector is bad
// (EFAULT, as the kernel says), or -2 when the stager could not (the caller
// reads the PFS). Waits while the stager lives, never longer than
// kPeerReadWaitNs.
ssize_t peer_read(JobMap* m, uint32_t file, uint64_t off, uint64_t len, const iovec* iov, int cnt);

// What the job changed about a file.
enum class Change : uint8_t {
  kBytes,  // its bytes or attributes (a write, truncate, chmod...): the PFS answers for it
  kNames,  // only which names lead to it (unlink, rename): descriptors of its copy still read right
};

// The job changed (or may have changed) the file: from now on every process
// of the job opens it, and stats it, on the PFS. Done in the map before the
// caller returns; the stager then deletes the copy.
void mark_stale(JobMap* m, uint32_t file, Change change = Change::kBytes);
// Every file and directory at or below directory `dir` (kRoot: the whole dataset).
void mark_stale_dir(JobMap* m, uint32_t dir, Change change);
// The file or directory with this identity, if it is in the dataset.
void mark_stale_inode(JobMap* m, const struct stat& st, Change change = Change::kBytes);

// A reader opened the copy of `file`: if stage-ahead made it, it is counted
// as read, which lets stage-ahead go further (Header::ahead_touched).
void touch(JobMap* m, uint32_t file);

// Claims a small file to read it whole (kNone -> kClaimed, stamped now).
bool claim(JobMap* m, uint32_t file, uint32_t& word);
// Gives a claim back (the read failed): the file is free to copy.
void release(JobMap* m, uint32_t file, uint32_t word);

}  // namespace monarch
