// Stage-ahead in proportion to the evidence: how far the copies made ahead of
// any reader may go.
//
// The copies made ahead that no reader has opened (what readers read from the
// PFS counts as opened: readers that outrun the copies pull stage-ahead
// along) stay within a window: the admin's `stage_ahead_window`, or a third of
// what the job's readers have shown they read where that is more. That
// evidence counts each file once: the files readers asked for or handed over,
// and the copies made ahead that they opened. A job that reads the whole
// dataset widens the window as it goes, and the copy threads keep the PFS
// busy (epoch 1 of issue 11's workload); a job that reads a part P once costs
// the PFS P, twice what its readers read from the PFS besides their copies
// (large files read ahead of their copy; not streams, whose reads are
// stdio's: those bytes, and as many copied ahead), and at most the larger of
// the window and P/3, or one file larger than these. The window grows only
// where the tiers have room for every file the node copies: elsewhere a copy
// no reader opens takes room a file the job reads then lacks, in every epoch
// (copies are never evicted).
#pragma once

#include <algorithm>
#include <cstdint>

namespace monarch {

inline constexpr uint64_t kAheadPerShown = 3;  // the window: a third of what readers read

// Whether a copy of `size` bytes may be made ahead: `ahead` bytes were copied
// (or are being copied) ahead of any reader, `opened` of them readers opened
// (with what they read from the PFS), `shown` bytes readers have shown they
// read (0 where the window must not grow). A file larger than the window goes
// only when no copy made ahead is unread.
inline bool ahead_room(uint64_t base, uint64_t ahead, uint64_t opened, uint64_t shown,
                       uint64_t size) {
  uint64_t unread = ahead > opened ? ahead - opened : 0;
  uint64_t window = std::max(base, shown / kAheadPerShown);
  return unread == 0 || unread + size <= window;
}

}  // namespace monarch
