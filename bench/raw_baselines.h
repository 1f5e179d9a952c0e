// Baselines measured in the same run as the Braid figures they are compared with:
// single-thread memcpy bandwidth, and raw OpenMPI all-reduce loops over MPI_COMM_WORLD.
#ifndef BRAID_BENCH_RAW_BASELINES_H_
#define BRAID_BENCH_RAW_BASELINES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace braid::bench {

struct RawRow {
  std::string op;
  size_t bytes = 0;
  double time_us = 0;
};

// Best of several single-thread memcpy's of `bytes` (time per copy).
RawRow MemcpyRow(size_t bytes);

// f32 sum over MPI_COMM_WORLD at each size: "raw_mpi_iallreduce" (MPI_Iallreduce + MPI_Wait,
// the primitive the mpi backend uses) and "raw_mpi_allreduce" (blocking). Time per op is the
// slowest rank's. MPI must already be initialized (by the mpi backend).
absl::Status RawMpiAllReduceRows(int64_t minbytes, int64_t maxbytes, int64_t step, int iters,
                                 int warmup, std::vector<RawRow>* rows);

}  // namespace braid::bench

#endif  // BRAID_BENCH_RAW_BASELINES_H_
