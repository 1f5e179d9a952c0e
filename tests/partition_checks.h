// Partitioned reductions against unpartitioned ones, on any backend: shared by the local test
// (tests/op_scheduler_test.cc) and the mpirun one (tests/mpi_reducer_test.cc).
//
//   EXPECT_OK(CheckPartitionedMatchesUnpartitioned(world, ReduceMode::kReduceScatter, 1, 256,
//   kTimeout));
//
// Collective over `world`. Two reducers over reference::MakeParams(dtypes) on the same groups
// (hybrid: a replicas x shards = 2 x (size / 2) mesh), one plain and one through an
// OpScheduler with `credit` bytes; each rank writes the same pseudo-random gradients (any
// values in [-1, 1), rounded to the gradient dtype: not exactly summable, so a changed
// reduction order would show) into both, runs one synced backward with readiness in a random
// order, and compares the results byte for byte (all-reduce: every gradient view; otherwise
// this rank's shard of every bucket). The error names the bucket and the first differing byte.
#ifndef BRAID_TESTS_PARTITION_CHECKS_H_
#define BRAID_TESTS_PARTITION_CHECKS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "scheduler/gradient_reducer.h"

namespace braid::sched::testing {

absl::Status CheckPartitionedMatchesUnpartitioned(Group& world, ReduceMode mode, int dtypes,
                                                  size_t credit, bool reduce_f32,
                                                  absl::Duration timeout);

}  // namespace braid::sched::testing

#endif  // BRAID_TESTS_PARTITION_CHECKS_H_
