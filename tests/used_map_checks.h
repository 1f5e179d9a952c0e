// The reducer's used-map agreement (scheduler/used_map.h) as a check any world runs (threads on
// `local` in used_map_test, processes under mpirun in mpi_reducer_test): every rank uses a
// random subset of the parameters in each microbatch (parameter 0 unused by every rank in step
// 2, parameter 5 used by rank 1 only) and marks them in a random order; the agreed map must be
// the OR over ranks and microbatches of the window, and every gradient the serial reference's
// average (zeros from the ranks that did not use it). Every rank calls the same check.
#ifndef BRAID_TESTS_USED_MAP_CHECKS_H_
#define BRAID_TESTS_USED_MAP_CHECKS_H_

#include <string>
#include <vector>

#include "comm/group.h"
#include "scheduler/gradient_reducer.h"

namespace braid::sched::testing {

struct UsedMapCase {
  ReduceMode mode;
  UnusedAgreement agree;
  const char* window;  // the microbatches of one step: N no_sync, R reduce_scatter_only, S sync
};

// "reduce_scatter_declared_NS": usable as a gtest parameter name.
std::string UsedMapCaseName(const UsedMapCase& c);

// Six f32 parameters "layer<i>.weight", ids 10 + i, odd sizes (several buckets, straddling
// shards with small caps).
std::vector<ParamSpec> UsedMapParams();

// Four steps of c.window on `world` (size a power of two; hybrid: a 2 x size/2 mesh). With
// `static_graph` the map must stay the first step's.
void CheckUsedMapAgainstReference(Group& world, const UsedMapCase& c, bool static_graph);

}  // namespace braid::sched::testing

#endif  // BRAID_TESTS_USED_MAP_CHECKS_H_
