// The measuring core of collective_latency: one rank's nccl-tests-style sweep over sizes and
// collectives on any Braid group, with an exact check of every op before it is timed.
//
//   CollectiveConfig c;  c.ops = {CollectiveKind::kAllReduce};  c.maxbytes = 1 << 20;
//   std::vector<CollectiveRow> rows;
//   RETURN_IF_ERROR(RunCollectiveSweep(world, c, &rows, /*progress=*/false));   // every rank
//
// Buffers live where the group's collectives read them: host memory for the CPU backends, and
// for a device group (its BufferOps are not synchronous(), e.g. nccl) memory from
// Group::buffer_ops().Allocate, filled and read back through host staging with BufferOps::Copy.
// The timed loop never touches the host copies. Time is issue + Wait per op (Wait resolves on
// the host once the device work ran), the mean over the iterations of the slowest rank.
// Check data are small integers (exact in every dtype and reduction order); avg is expected as
// sum-then-divide in the dtype (f32 for the half types), so on nccl (a pre-multiplied 1/n) the
// check is exact for power-of-two group sizes only.
#ifndef BRAID_BENCH_COLLECTIVE_TABLE_H_
#define BRAID_BENCH_COLLECTIVE_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/group.h"

namespace braid::bench {

struct CollectiveConfig {
  std::string backend;
  int ranks = 4;
  int64_t minbytes = 8, maxbytes = int64_t{64} << 20, step = 2;
  int iters = 20, warmup = 5;
  std::vector<CollectiveKind> ops;
  DType dtype = DType::kF32;
  ReduceKind redop = ReduceKind::kSum;
  bool csv = false, check = true, in_place = false;
  int compare_rounds = 9;  // mpi: rounds of the interleaved raw-MPI comparison
};

struct CollectiveRow {
  std::string op;
  size_t bytes = 0, count = 0;
  std::string dtype, redop;
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = 0;  // elements that differed from the exact result, summed over ranks
};

// nccl-tests' bus-bandwidth factor of collective k on n ranks.
double BusFactor(CollectiveKind k, int n);

// One rank's sweep (collective over `g`: every rank calls it with the same config). Rank 0's
// call appends one row per (op, size) to *rows when rows is non-null.
absl::Status RunCollectiveSweep(Group& g, const CollectiveConfig& c,
                                std::vector<CollectiveRow>* rows, bool progress);

// Bandwidth baseline measured on the group's own memory: the best time of a copy of `bytes`
// inside the memory the group's collectives use (host: one thread's memcpy; device: a
// device-to-device BufferOps::Copy, timed to its Synchronize). Row "memcpy" or "d2d_copy";
// algbw = bytes / time (read + write not doubled, as the memcpy row).
absl::StatusOr<CollectiveRow> CopyBaselineRow(Group& g, size_t bytes);

void PrintCollectiveTable(const CollectiveConfig& c, int n, const std::vector<CollectiveRow>& rows);

}  // namespace braid::bench

#endif  // BRAID_BENCH_COLLECTIVE_TABLE_H_
