// Baselines measured in the same run as the Braid figures they are compared with:
// single-thread memcpy bandwidth, and raw OpenMPI all-reduce loops interleaved with Braid's.
#ifndef BRAID_BENCH_RAW_BASELINES_H_
#define BRAID_BENCH_RAW_BASELINES_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "comm/group.h"

namespace braid::bench {

struct RawRow {
  std::string op;
  size_t bytes = 0;
  double time_us = 0;
};

// Best of several single-thread memcpy's of `bytes` (time per copy).
RawRow MemcpyRow(size_t bytes);

// In-place f32 sum all-reduce at `bytes`, median over `rounds` rounds of the mean time per call
// (slowest rank), with the loops' order rotated every round so none always runs first:
//   raw_wait:     MPI_Iallreduce + MPI_Wait on a private dup of MPI_COMM_WORLD
//   raw_test:     MPI_Iallreduce completed by an MPI_Test spin (what a Work poller does)
//   raw_blocking: MPI_Allreduce
//   braid:        Group::AllReduce + Work::Wait on `world` (the mpi backend)
struct MpiCompareRow {
  size_t bytes = 0;
  double raw_wait_us = 0, raw_test_us = 0, raw_blocking_us = 0, braid_us = 0;
};
absl::Status CompareWithRawMpi(Group& world, const std::vector<size_t>& sizes, int rounds,
                               int iters_8b, std::vector<MpiCompareRow>* rows);

}  // namespace braid::bench

#endif  // BRAID_BENCH_RAW_BASELINES_H_
