// Unused-parameter behaviour of the GradientReducer, as checks any world can run (threads on
// `local` in reducer_errors_test, processes under mpirun in mpi_reducer_test). Every rank of
// `g` calls the same check with the same config; gtest failures are reported on the caller.
#ifndef BRAID_TESTS_REDUCER_UNUSED_CHECKS_H_
#define BRAID_TESTS_REDUCER_UNUSED_CHECKS_H_

#include <vector>

#include "comm/group.h"
#include "scheduler/gradient_reducer.h"

namespace braid::sched::testing {

// "fc.weight" (id 1, 8 floats) and "fc.bias" (id 2, 3 floats).
std::vector<ParamSpec> TwoParams();

// Without allow_unused, a parameter never marked fails FinishBackward, named.
void CheckUnusedReportedByName(Group& g, ReducerConfig cfg);

// With allow_unused: a parameter unmarked in a synced backward but accumulated in a no_sync one
// is reduced (its sum kept, on rank 0), and one unused since the last sync is zero-filled. The
// world size must be a power of two (the averages are then exact).
void CheckUnusedZeroFilledButNoSyncSumsKept(Group& g, ReducerConfig cfg);

}  // namespace braid::sched::testing

#endif  // BRAID_TESTS_REDUCER_UNUSED_CHECKS_H_
