// Credit-sized partitions of one reduction: which element ranges a large all-reduce or
// reduce-scatter is split into so that no single collective moves more than a credit of bytes.
// Pure computation on plan data (counts, dtype, group size, the credit): the same inputs give
// the same partitions on every rank, which is what lets ranks match the partitions' collectives
// by position (see scheduler/op_scheduler.h).
//
//   // A reduce-scatter of 4 ranks x 1M f32 elements per shard, credit 4 MiB:
//   std::vector<PartRange> parts = SplitReduction(/*count=*/1 << 20, 4, /*ranks=*/4, 4 << 20);
//   // -> 4 ranges of 256K elements; partition k reduce-scatters elements [lo, hi) of every
//   //    rank's shard region (16 MiB of input / 4 partitions = 4 MiB each).
//
// Ranges are within the per-call count in NCCL's terms: the whole buffer of an all-reduce
// (ranks = 1), the per-rank block (recvcount) of a reduce-scatter (ranks = the group's size).
// A partition moves ranks x (hi - lo) x esize bytes of input, at most max(credit, one aligned
// unit); boundaries fall on multiples of 64 bytes (a cache line, the plan's alignment), and
// the partitions are as equal as that allows. They are disjoint, in increasing order, and
// cover [0, count) exactly.
//
// Why results are bit-identical to the unpartitioned call: an all-reduce or reduce-scatter
// combines each element independently, across ranks; a partition reduces the same elements
// from the same ranks with the same op (and pre/post-divide scalars), so as long as the
// backend's per-element combination order does not depend on the call's size (local: rank
// order 0..n-1 always; any backend at 2 ranks: a + b == b + a), every element comes out
// the same. The reduce-scatter partition packs slice [lo, hi) of each rank's region into a
// contiguous staging block first (copies are exact) and reduces into [lo, hi) of the shard.
#ifndef BRAID_SCHEDULER_PARTITION_H_
#define BRAID_SCHEDULER_PARTITION_H_

#include <cstddef>
#include <vector>

namespace braid::sched {

struct PartRange {
  size_t lo = 0, hi = 0;  // elements [lo, hi) of the per-call count
  size_t count() const { return hi - lo; }
};

inline constexpr size_t kPartitionAlignBytes = 64;

// credit_bytes == 0, or a call within the credit: one range [0, count). count == 0: one empty
// range (the collective still runs, as unpartitioned).
std::vector<PartRange> SplitReduction(size_t count, size_t esize, int ranks, size_t credit_bytes);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_PARTITION_H_
