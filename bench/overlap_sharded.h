// The fully sharded (ZeRO-3 / FSDP) step of bench/overlap (--mode=fully_sharded): one rank's
// stack of a gather group, a ParamGatherer (fully_sharded), a UnitScheduler (one unit per
// layer of bench/overlap_model.h, prefetch 1) and a reduce-scatter GradientReducer, optionally
// sharing an OpScheduler (gathers urgent, reductions partitioned: the `priority` mode).
//
//   ASSIGN_OR_RETURN(auto stack, ShardedStack::Create(world, model, nullptr, timeout, cap, first));
//   RETURN_IF_ERROR(stack->SetScheduler(scheduler));   // the priority mode, same buffers
//   RETURN_IF_ERROR(stack->Step(ShardedStep::kOverlapped, compute, &backward_end));
//
// A step: forward over the units in order (BeginForward, compute(layer, true), EndForward),
// then backward in reverse (BeginBackward, compute(layer, false), the layer's marks,
// EndBackward), FinishBackward, EndStep. The first step is the UnitScheduler's recording step
// (every gather on demand); later ones prefetch the next unit. kCommOnly runs the same calls
// without compute, kSyncAfterBackward marks every parameter after the backward loop (the
// gathers stay where the model needs them).
#ifndef BRAID_BENCH_OVERLAP_SHARDED_H_
#define BRAID_BENCH_OVERLAP_SHARDED_H_

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/overlap_model.h"
#include "comm/group.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/op_scheduler.h"
#include "scheduler/param_gatherer.h"
#include "scheduler/unit_scheduler.h"

namespace braid::bench {

enum class ShardedStep { kCommOnly, kSyncAfterBackward, kOverlapped };

class ShardedStack {
 public:
  // Collective over `world` (splits a gather group, verifies plans). `scheduler`: optional,
  // not owned, must outlive the stack.
  static absl::StatusOr<std::unique_ptr<ShardedStack>> Create(
      Group& world, const OverlapModel& model, sched::OpScheduler* scheduler,
      absl::Duration timeout, size_t bucket_cap_bytes, size_t first_bucket_cap_bytes);
  ~ShardedStack();

  sched::GradientReducer& reducer() { return *reducer_; }
  // Between steps, at the same step on every rank: the reducer and the gatherer go through
  // `scheduler` from now on (null: none).
  absl::Status SetScheduler(sched::OpScheduler* scheduler);
  // compute(layer, forward): one layer's compute (backward: writes its gradients).
  absl::Status Step(ShardedStep kind, const std::function<void(int, bool)>& compute,
                    std::chrono::steady_clock::time_point* backward_end);

 private:
  ShardedStack() = default;
  const OverlapModel* model_ = nullptr;
  std::unique_ptr<Group> gather_group_;
  std::unique_ptr<sched::GradientReducer> reducer_;
  std::unique_ptr<sched::ParamGatherer> gatherer_;
  std::unique_ptr<sched::UnitScheduler> units_;
};

}  // namespace braid::bench

#endif  // BRAID_BENCH_OVERLAP_SHARDED_H_
