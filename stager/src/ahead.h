// Stage-ahead in proportion to the evidence: how far the copies made ahead of
// any reader may go.
//
// The evidence is what the job's readers have read: the files they asked for
// or handed over, the copies made ahead that they opened, and what they read
// from the PFS. The bytes copied ahead that no reader has opened stay within
// a window of the larger of the admin's `stage_ahead_window` and a third of
// that evidence. A job that reads the whole dataset widens it as it goes (in
// epoch 1 of issue 11's workload the copy threads then keep the PFS busy
// where a fixed window of 5% left it a quarter idle); a job that reads a part
// P once costs the PFS at most P plus the larger of the window and P/3.
#pragma once

#include <algorithm>
#include <cstdint>

namespace monarch {

inline constexpr uint64_t kAheadPerShown = 3;  // the window: a third of what readers read

// Whether a copy of `size` bytes may be made ahead: `ahead` bytes were copied
// (or are being copied) ahead of any reader, `opened` of them readers opened
// (with what they read from the PFS), `asked` bytes are of files readers asked
// for or handed over. A file larger than the window goes only when no copy
// made ahead is unread.
inline bool ahead_room(uint64_t base, uint64_t ahead, uint64_t opened, uint64_t asked,
                       uint64_t size) {
  uint64_t unread = ahead > opened ? ahead - opened : 0;
  uint64_t window = std::max(base, (asked + opened) / kAheadPerShown);
  return unread == 0 || unread + size <= window;
}

}  // namespace monarch
