// The fully sharded (ZeRO-3 / FSDP) stack of bench/overlap (--mode=fully_sharded): a
// TrainingStack (optim/training_stack.h) whose reduce-scatter reducer has one unit per layer of
// bench/overlap_model.h, with a gather-only fully sharded parameter side (a gatherer with
// fully_sharded and a UnitScheduler with prefetch 1; no optimizer: the bench times the
// communication). One step of it is RunShardedStep (bench/overlap_steps.h).
//
//   ASSIGN_OR_RETURN(auto stack, MakeShardedStack(world, model, timeout, cap, first));
//   RETURN_IF_ERROR(stack->SetScheduler(scheduler));   // the priority mode, same buffers
#ifndef BRAID_BENCH_OVERLAP_SHARDED_H_
#define BRAID_BENCH_OVERLAP_SHARDED_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/overlap_model.h"
#include "comm/group.h"
#include "optim/training_stack.h"

namespace braid::bench {

// Collective over `world` (splits a gather group, verifies plans).
absl::StatusOr<std::unique_ptr<optim::TrainingStack>> MakeShardedStack(
    Group& world, const OverlapModel& model, absl::Duration timeout, size_t bucket_cap_bytes,
    size_t first_bucket_cap_bytes);

}  // namespace braid::bench

#endif  // BRAID_BENCH_OVERLAP_SHARDED_H_
