// The fast-file-system check's decisions: is the dataset's file system so
// fast (a local disk, an all-flash PFS) that reading copies cannot beat
// reading it? Then the stager makes no more copies (Header::copies_off) and
// readers read the dataset directly. The copier measures
// (Copier::sample_tier, Copier::judge_the_pfs); these functions decide.
//
// Two ways:
// - early, against the tier itself: the first bytes of each of the first
//   kJudgeFiles * kJudgeWindows copies from the PFS are read again from the
//   PFS file and then from the copy, each as a reader reads a file the page
//   cache no longer holds, back to back in one thread: the same load for
//   both (a copy whose PFS open was slow counts as slow, unread: a real PFS
//   pays nothing). After every kJudgeFiles of them, the
//   medians of all so far decide. Load on the node (CPU, the disk's queue)
//   slows both reads alike, where an absolute rate of small files measures
//   mostly their latency and the load. Measured on the fast-file-system
//   benchmark (dataset and tier on one disk, 2 busy cores): single files
//   0.2-7x, medians of 8 files 0.5-3.0x and of 16 to 32 files at most 1.44x
//   in 12 runs with 8 copy threads, decided after 8 to 38 copies. (Timed
//   against the copy's own first read, which also read the file's metadata
//   while the other copies ran, the medians were 1.8-2.6x in a fifth to a
//   third of the runs, and 840-1,411 copies were made before the mean rates
//   below said fast.)
// - at any time, from the copy threads' mean rates, after kJudgeOpens files
//   and kJudgeBytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace monarch {

// A PFS open costs a metadata server's round trip (hundreds of us and more);
// a local file system's, tens of us. The bandwidth floor keeps copying from
// a file system that opens fast but reads slowly (NFS with cached attributes
// over 1 GbE: 0.03 GB/s a thread). Measured by the copy threads during a job
// (contrib/bench/run, 4 readers and 4 copy threads on 2 busy cores): the
// local disk 2-11 us an open, 0.07-0.18 GB/s a thread (small files: mostly
// their latency); the emulated PFS (1 ms, 400 MB/s) 1.4-2.2 ms, 0.08-0.10 GB/s.
inline constexpr double kFastOpenUs = 100, kFastGBs = 0.1;
// A PFS read of a copy's first bytes taking at most this many times the
// tier's read of them.
inline constexpr double kFastRatio = 1.5;
inline constexpr size_t kJudgeFiles = 8, kJudgeWindows = 4;
inline constexpr uint64_t kJudgeOpens = 8, kJudgeBytes = 8 << 20;

// One of the first copies: its PFS open, its first PFS read, and the same
// bytes read back from the tier (0: not read back, its open was slow).
struct TierSample {
  uint64_t open_ns, pfs_ns, tier_ns;
};

// A PFS read back more than this many times faster than the copy's own
// first read of the same bytes was answered by a cache the stager cannot
// empty (a server's memory, a client cache outside the page cache, pages a
// reader maps): it says nothing of reading the dataset, and the sample is
// left out. On one local disk the first read took at most 2.6x the read back
// in medians of 8 (the file's metadata, read with it). Leaving samples out
// raises the median a little: in doubt the check says slow, and copies go on.
inline constexpr double kCachedRatio = 4;
inline bool read_back_cached(uint64_t first_ns, uint64_t again_ns) {
  return double(again_ns) * kCachedRatio < double(first_ns);
}

// Whether a copy's PFS open was fast enough for the copy to be read back.
inline bool fast_open(uint64_t open_ns) {
  return double(open_ns) <= kFastOpenUs * 1e3;
}

struct Verdict {
  bool fast = false;
  double open_us = 0;  // the open time judged (median, or mean)
  double read = 0;     // by_tier: PFS read / tier read (median); by_rates: GB/s a thread
};

// The medians of `samples` (at least one): a PFS open under kFastOpenUs and
// a PFS read at most kFastRatio times the tier's say fast.
Verdict fast_by_tier(std::vector<TierSample> samples);

// The copy threads' totals: after kJudgeOpens opens and kJudgeBytes, a mean
// open under kFastOpenUs and reads of at least kFastGBs a thread say fast.
Verdict fast_by_rates(uint64_t opens, uint64_t open_ns, uint64_t bytes, uint64_t read_ns);

}  // namespace monarch
