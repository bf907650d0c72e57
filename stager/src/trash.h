// Getting a directory out of the way at once and deleting it later: a
// rename into a trash directory on the same file system costs the same for
// one file or a million, and `monarch-purge` deletes the trash in the
// background, at the lowest priority, with the bounded remover of
// remove_tree.h. The Slurm epilog ends a job this way (its cost never grows
// with what the user built), and monarch-run can end a run the same way.
//
// A trash directory belongs to whoever purges it and is private (mode 0700):
// nobody else can reach what is in it, so nothing in it changes under the
// purge. One purge runs per trash at a time (a lock on the directory).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "remove_tree.h"

namespace monarch {

// Renames `name` in `parent_fd` into the trash `trash_fd` under
// "<name>.<random>", never replacing anything. Constant time. False with
// errno set when it cannot (ENOENT: nothing there; EBUSY: a mount point;
// EXDEV: another file system).
bool move_to_trash(int parent_fd, const std::string& name, int trash_fd);

// True when the trash holds anything.
bool trash_has_entries(int trash_fd);

struct PurgeResult {
  bool busy = false;     // another purge holds the lock: it does the work
  uint64_t entries = 0;  // trash entries deleted
  RemoveResult removed;  // summed over the entries; mounts and errors: what was left
};

// Deletes everything in the trash, until it is empty or nothing more can
// go, holding the trash's lock; returns at once (busy) if another purge
// holds it. Entries moved in while it runs are deleted too. A regular file
// at the trash's top (a job's image) is emptied before it is unlinked, so
// that its blocks come back even while someone still holds it open.
PurgeResult purge_trash(int trash_fd);

// Puts the calling process at the lowest CPU and I/O priority (best-effort
// class, lowest level): deletion in the background never competes with jobs.
void lowest_priority();

// Starts `monarch-purge DIR [--log FILE]` (installed with Monarch) detached:
// its own session, nobody's child, stdin and stdout on /dev/null, its one
// summary line appended to `log` ("" for none). The descriptors `hand_over`
// go with it and are closed when it exits: the caller closes its own
// copies at once, so the purge pays whatever letting them go costs (the
// last reference to a detached mount). Returns at once; false with a
// message when it could not be started.
bool start_purge(const std::string& trash_dir, const std::string& log,
                 const std::vector<int>& hand_over, std::string& error);

}  // namespace monarch
