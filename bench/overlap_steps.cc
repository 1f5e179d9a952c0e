// One step of each overlap mode on one rank; see overlap_steps.h.
#include "bench/overlap_steps.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm/status_macros.h"

namespace braid::bench {
namespace {

using sched::GradientReducer;
using sched::ReduceMode;
using sched::SyncMode;

// One layer's backward compute.
void Compute(const RankLayer& l, const Config& c, int rank) {
  if (!c.sleep_compute) {
    WriteGradients(l.spans, rank, l.writes);
    return;
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(c.layer_compute_us);
  WriteGradients(l.spans, rank, l.elems);
  std::this_thread::sleep_until(end);
}

// An optimizer step mode: the backward with marks as layers finish, then (after_backward)
// Step(), then the wait a framework does before its next forward. Fills `t` except t->start.
absl::Status RunOptimizerStep(optim::ShardedOptimizer& opt, bool explicit_step, GradientReducer& r,
                              const std::vector<RankLayer>& backward, const Config& c, int rank,
                              StepTimes* t) {
  RETURN_IF_ERROR(opt.BeginBackward(SyncMode::kSync));
  for (const RankLayer& l : backward) {
    Compute(l, c, rank);
    for (sched::ParamId id : l.ids) RETURN_IF_ERROR(r.MarkReady(id));
  }
  t->backward_end = Clock::now();
  RETURN_IF_ERROR(opt.FinishBackward());
  if (explicit_step) RETURN_IF_ERROR(opt.Step());
  RETURN_IF_ERROR(opt.WaitAllParams());
  t->end = Clock::now();
  return absl::OkStatus();
}

// One layer's forward compute in fully sharded mode: half a backward layer's.
void ComputeForward(const RankLayer& l, const Config& c, int rank) {
  if (!c.sleep_compute) {
    WriteGradients(l.spans, rank, std::max(l.elems, l.writes / 2));
    return;
  }
  std::this_thread::sleep_for(std::chrono::microseconds(c.layer_compute_us / 2));
}

}  // namespace

absl::Status RunShardedStep(StepMode mode, optim::TrainingStack* stack,
                            const std::vector<RankLayer>& backward, const Config& c, int rank,
                            StepTimes* t) {
  const int layers = static_cast<int>(backward.size());
  // backward[] runs last layer first: layer l is backward[layers - 1 - l].
  auto layer = [&](int l) -> const RankLayer& { return backward[layers - 1 - l]; };
  if (mode == StepMode::kComputeOnly) {
    for (int l = 0; l < layers; ++l) ComputeForward(layer(l), c, rank);
    for (int l = layers - 1; l >= 0; --l) Compute(layer(l), c, rank);
    t->backward_end = t->end = Clock::now();
    return absl::OkStatus();
  }
  // Forward over the units in order, then backward in reverse with each layer's marks (after
  // the backward loop for sync_after_backward: the gathers stay where the model needs them).
  // The first step is the UnitScheduler's recording step; later ones prefetch the next unit.
  sched::UnitScheduler& units = *stack->units();
  sched::GradientReducer& reducer = stack->reducer();
  const bool with_compute = mode != StepMode::kCommOnly;
  for (int l = 0; l < layers; ++l) {
    RETURN_IF_ERROR(units.BeginForward(l));
    if (with_compute) ComputeForward(layer(l), c, rank);
    RETURN_IF_ERROR(units.EndForward(l));
  }
  const bool marks_inline = mode != StepMode::kSyncAfterBackward;
  if (marks_inline) RETURN_IF_ERROR(stack->BeginBackward(SyncMode::kSync));
  for (int l = layers - 1; l >= 0; --l) {
    RETURN_IF_ERROR(units.BeginBackward(l));
    if (with_compute) Compute(layer(l), c, rank);
    if (marks_inline) {
      for (sched::ParamId id : layer(l).ids) RETURN_IF_ERROR(reducer.MarkReady(id));
    }
    RETURN_IF_ERROR(units.EndBackward(l));
  }
  t->backward_end = Clock::now();
  if (!marks_inline) {
    RETURN_IF_ERROR(stack->BeginBackward(SyncMode::kSync));
    for (int l = layers - 1; l >= 0; --l) {
      for (sched::ParamId id : layer(l).ids) RETURN_IF_ERROR(reducer.MarkReady(id));
    }
  }
  RETURN_IF_ERROR(stack->FinishBackward());
  RETURN_IF_ERROR(units.EndStep());
  t->end = Clock::now();
  return absl::OkStatus();
}

absl::Status RunStep(StepMode mode, GradientReducer& r, RankOptimizers* opts,
                     const std::vector<RankLayer>& backward, const Config& c, int rank,
                     StepTimes* t) {
  if (mode == StepMode::kOptimAfterBackward)
    return RunOptimizerStep(*opts->after->optimizer, true, r, backward, c, rank, t);
  if (mode == StepMode::kOptimOverlapped)
    return RunOptimizerStep(*opts->overlapped->optimizer, false, r, backward, c, rank, t);
  if (mode == StepMode::kPriority)
    mode = StepMode::kOverlapped;  // the caller passed the scheduled reducer
  if (mode == StepMode::kOverlapped) RETURN_IF_ERROR(r.BeginBackward(SyncMode::kSync));
  for (const RankLayer& l : backward) {
    if (mode != StepMode::kCommOnly) Compute(l, c, rank);
    if (mode == StepMode::kOverlapped) {
      for (sched::ParamId id : l.ids) RETURN_IF_ERROR(r.MarkReady(id));
    }
  }
  t->backward_end = Clock::now();
  if (mode == StepMode::kCommOnly || mode == StepMode::kSyncAfterBackward) {
    RETURN_IF_ERROR(r.BeginBackward(SyncMode::kSync));
    for (const RankLayer& l : backward) {
      for (sched::ParamId id : l.ids) RETURN_IF_ERROR(r.MarkReady(id));
    }
  }
  if (mode != StepMode::kComputeOnly) RETURN_IF_ERROR(r.FinishBackward());
  t->end = Clock::now();
  return absl::OkStatus();
}

int64_t CountWrong(const GradientReducer& r, ReduceMode mode, int shard_rank, int world_size) {
  const sched::BucketPlan& plan = r.plan();
  const float offset = static_cast<float>(world_size - 1) / 2;
  int64_t wrong = 0;
  for (size_t i = 0; i < plan.params().size(); ++i) {
    const sched::ParamSpec& p = plan.params()[i];
    const sched::ParamSlot& slot = plan.slot(static_cast<int>(i));
    const sched::Bucket& bk = plan.buckets()[slot.bucket];
    size_t lo = 0, hi = bk.padded_count;
    if (mode != ReduceMode::kAllReduce) {
      lo = static_cast<size_t>(shard_rank) * bk.shard_count;
      hi = lo + bk.shard_count;
    }
    const float* g = static_cast<const float*>(r.GradView(p.id)->data);
    for (size_t j = 0; j < p.count; ++j) {
      const size_t pos = slot.offset + j;
      if (pos < lo || pos >= hi) continue;
      wrong += g[j] != GradValue(j, 0) + offset;
    }
  }
  return wrong;
}

}  // namespace braid::bench
