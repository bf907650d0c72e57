// Counters kept by every process of a job (one ProcSlot each, in the job map)
// and by the stager. The job's totals of reads and bytes are not counted
// separately: Stats sums them from the three sources (tiers, memory, PFS). One X-macro list
// generates the enum, the names written to the statistics, and the meaning shown by monarch-report
// --explain.
#pragma once

namespace monarch {

// Opens are counted in this many buckets (file number modulo kPassBuckets),
// so that the statistics tell a pass over the dataset from re-reads of a few
// of its files (Stats::tick).
inline constexpr int kPassBuckets = 64;

// X(name, count, meaning). Entries with count 4 are per node-local tier,
// pass_opens has one per bucket.
#define MONARCH_PROCESS_COUNTERS(X)                                                           \
  X(opens, 1, "opens of dataset files by the job (what would reach the PFS without Monarch)") \
  X(reads, 1, "read calls on dataset files (the sum of the four sources below)")              \
  X(bytes, 1, "bytes those read calls returned (the sum below; mappings: mmap_bytes)")        \
  X(tier_opens, 4, "opens answered from a node-local tier")                                   \
  X(tier_reads, 4, "read calls answered from a node-local tier")                              \
  X(tier_bytes, 4, "bytes answered from a node-local tier")                                   \
  X(mem_reads, 1, "read calls answered from bytes read whole at open")                        \
  X(mem_bytes, 1, "bytes answered from bytes read whole at open")                             \
  X(peer_served_reads, 1, "read calls answered with bytes another node of the job sent")      \
  X(peer_served_bytes, 1, "bytes answered with bytes another node of the job sent")           \
  X(pfs_served_reads, 1, "read calls answered by a read of the PFS")                          \
  X(pfs_served_bytes, 1, "bytes answered by a read of the PFS")                               \
  X(pfs_opens, 1, "opens sent to the PFS by the job's processes")                             \
  X(pfs_reads, 1, "reads sent to the PFS by the job's processes")                             \
  X(pfs_bytes, 1, "bytes read from the PFS by the job's processes")                           \
  X(partial_reads, 1, "reads answered from a copy still being written")                       \
  X(switches, 1, "open files moved to a local copy that completed while they were open")      \
  X(handoffs, 1, "files read whole at open and handed to the stager")                         \
  X(handoff_bytes, 1, "bytes handed to the stager")                                           \
  X(pfs_read_ns, 1, "time the job's processes spent in reads of the PFS")                     \
  X(local_sample_reads, 1, "local reads timed (each thread's first, then one in 64)")         \
  X(local_sample_bytes, 1, "bytes of the timed local reads")                                  \
  X(local_sample_ns, 1, "time spent in the timed local reads")                                \
  X(stat_index, 1, "stat calls answered from the index")                                      \
  X(stat_pfs, 1, "stat calls on dataset paths sent to the PFS")                               \
  X(mmaps, 1, "mappings of dataset files (mmap calls that succeeded), apart from reads")      \
  X(mmap_local, 1, "of which mapped a node-local copy")                                       \
  X(mmap_bytes, 1, "bytes they spanned in the file: their pages are read unseen")             \
  X(mmap_local_bytes, 1, "of which on a node-local copy")                                     \
  X(pass_opens, kPassBuckets, "opens of dataset files by file number modulo 64 (passes)")     \
  X(fb_no_stager, 1, "fallbacks to the PFS: stager not running")                              \
  X(fb_stale, 1, "fallbacks to the PFS: the PFS file changed after it was indexed")           \
  X(fb_wait, 1, "fallbacks to the PFS: a copy under way made no progress in time")            \
  X(fb_error, 1, "fallbacks to the PFS: a local copy could not be opened or read")

enum Counter : int {
#define MONARCH_COUNTER_ENUM(name, n, meaning) c_##name, c_##name##_end = c_##name + n - 1,
  MONARCH_PROCESS_COUNTERS(MONARCH_COUNTER_ENUM)
#undef MONARCH_COUNTER_ENUM
      kNumCounters
};

}  // namespace monarch

namespace monarch {

// X(name, meaning): counters of the stager itself.
#define MONARCH_STAGER_COUNTERS(X)                                                           \
  X(copies, "files copied from the PFS to a node-local tier")                                \
  X(copy_bytes, "bytes of those copies")                                                     \
  X(copy_ns, "time spent in those copies, summed over copy threads")                         \
  X(pfs_opens, "opens sent to the PFS by the stager")                                        \
  X(pfs_open_ns, "time spent in those opens")                                                \
  X(pfs_reads, "reads sent to the PFS by the stager")                                        \
  X(pfs_bytes, "bytes read from the PFS by the stager")                                      \
  X(pfs_read_ns, "time spent in those reads")                                                \
  X(check_bytes, "bytes read again from the PFS by the fast-file-system check")              \
  X(check_cached, "copies the check left out: the PFS read back came from a cache")          \
  X(no_buffer, "times a copy waited: no memory for its buffer")                              \
  X(handoffs, "files written from bytes a reader had read whole")                            \
  X(handoff_bytes, "bytes of those files")                                                   \
  X(adopted, "copies found from an earlier stager of this job and kept")                     \
  X(adopted_bytes, "bytes of those copies")                                                  \
  X(discarded, "copies found from an earlier stager that no longer matched the PFS")         \
  X(noroom, "files that fit on no tier")                                                     \
  X(copy_errors, "copies that failed (an error of the PFS file, the tier or its path)")      \
  X(copy_denied, "of which permission was denied on the PFS file (EACCES, EPERM)")           \
  X(copy_errno, "the error number of the last other failed copy (0: none or no errno)")      \
  X(stale, "files whose PFS version changed after indexing")                                 \
  X(tier_full, "times a tier's file system ran out of space")                                \
  X(requests, "requests received from the job's processes")                                  \
  X(ignored, "requests ignored (another generation, or nothing to do)")                      \
  X(preemptions, "background copies paused for a reader's request")                          \
  X(copies_off, "1 when copying stopped: the dataset's file system is as fast as a tier")    \
  X(peer_copies, "files copied from another node of the job")                                \
  X(peer_bytes, "bytes received from other nodes (those copies, and reads passed on)")       \
  X(peer_fallbacks, "copies from another node that went to the PFS instead")                 \
  X(served_bytes, "bytes sent to other nodes (an answer sent again counts again)")           \
  X(peers_failed, "nodes of the job this node stopped asking (dead or unreachable)")         \
  X(index_received, "1 when the index came from another node instead of a walk")             \
  X(index_source, "the node the index came from last: its place in the job's nodes, plus 1") \
  X(index_bytes_in, "bytes of the index received from other nodes")                          \
  X(index_bytes_out, "bytes of the index sent to other nodes (relayed ones included)")       \
  X(index_ms, "time from the stager's start until it held the whole index")                  \
  X(peak_memory, "the stager's peak resident memory, in bytes")                              \
  X(alone, "1 when this node of a multi-node job cached on its own, outside the job's cache")

enum StagerCounter : int {
#define MONARCH_STAGER_ENUM(name, meaning) s_##name,
  MONARCH_STAGER_COUNTERS(MONARCH_STAGER_ENUM)
#undef MONARCH_STAGER_ENUM
      kNumStagerCounters
};

}  // namespace monarch
