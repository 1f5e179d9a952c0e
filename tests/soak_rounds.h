// The rounds of the randomized soak (tests/soak_test.cc): each draws one scenario from `seed`,
// runs it on the ranks it needs, checks every step bit for bit against a serial reference
// (EXPECT failures carry the seed in their trace) and returns how many steps it checked.
//
//   const int steps = FsdpRound(seed);   // one round again: soak_test --round=fsdp:<seed>
//
// The optimizer-side rounds share tests/optim/optimizer_harness.h: its exact gradients (k/8,
// power-of-two worlds) make every sum, average, norm and clip factor exact, so the reference
// is the serial unsharded AdamW / SGD whatever the sharding, order or placement.
#ifndef BRAID_TESTS_SOAK_ROUNDS_H_
#define BRAID_TESTS_SOAK_ROUNDS_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/optim/optimizer_harness.h"

namespace braid::testing {

// Fully sharded units (scheduler/unit_scheduler.h): random unit count, membership and forward
// order, prefetch depth, live-bytes limit, reshard_after_forward, a shared pool; every forward
// reads each unit's parameters against the reference.
int FsdpRound(uint64_t seed);
// Re-plans under an optimizer (optim/training_stack.h): DDP's rebuild from the first
// backward's readiness order and Replan to random caps, at random step boundaries.
int ReplanRound(uint64_t seed);
// Optimizer state offload (OptimizerConfig::offload) on the nccl backend's fake device.
int OffloadRound(uint64_t seed);

// Shared draws. An accumulation schedule of 0-2 no_sync (or, when `hybrid`,
// reduce_scatter_only) microbatches ending in sync.
std::vector<optim::testing::SyncMode> RandomSchedule(std::mt19937_64& rng, bool hybrid);
// AdamW or SGD, clipping (sometimes), skip_nonfinite with an inf or NaN at a random step
// (sometimes), overlap on or off, random parameter sizes; `steps` steps.
void RandomizeOptimizer(std::mt19937_64& rng, int steps, optim::testing::OptScenario* s);
// "2x2 bf16 adamw cap 1024 steps 3 schedule NS clip ...": for failure messages (the rank
// threads do not see the soak's SCOPED_TRACE).
std::string DescribeOptimizer(const optim::testing::OptScenario& s);

}  // namespace braid::testing

#endif  // BRAID_TESTS_SOAK_ROUNDS_H_
