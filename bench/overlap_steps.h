// One step of each overlap mode on one rank (bench/overlap.cc): the backward's compute, the
// marks and FinishBackward of the reducer, the optimizer modes' Step and WaitAllParams, the
// fully sharded step; and the exactness check of a reduced result. The driver (rank threads,
// start line, interleaving, autotuning) stays in overlap.cc; the times go to overlap_report.h.
//
//   StepTimes t;
//   t.start = Clock::now();   // the caller's common start
//   RETURN_IF_ERROR(RunStep(StepMode::kOverlapped, reducer, &opts, backward, c, rank, &t));
//   int64_t wrong = CountWrong(reducer, c.reduce, shard_rank, world_size);   // 0 expected
//
// A step is collective: every rank runs the same mode at once. RunStep takes kPriority and
// kAutotuned as kOverlapped (the caller attaches the scheduler or picks the reducer).
#ifndef BRAID_BENCH_OVERLAP_STEPS_H_
#define BRAID_BENCH_OVERLAP_STEPS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "bench/overlap_compute.h"
#include "bench/overlap_config.h"
#include "bench/overlap_report.h"
#include "comm/group.h"
#include "optim/training_stack.h"
#include "scheduler/gradient_reducer.h"

namespace braid::bench {

// One layer's backward as a rank runs it: the gradients its compute writes and the ids it
// marks, in backward order.
struct RankLayer {
  std::vector<GradSpan> spans;
  std::vector<sched::ParamId> ids;
  size_t elems = 0;   // one full pass
  size_t writes = 0;  // --compute=busy: the calibrated work (>= elems)
};

// The two sharded optimizers of --optimizer, each a parameter side (own gather group, gatherer
// and optimizer) over the stack's one reducer (optim::TrainingStack::BuildParamSide): `after`
// steps when told (Step()), `overlapped` as reductions complete.
struct RankOptimizers {
  std::unique_ptr<optim::ParamSide> after, overlapped;
};

// One fully sharded step (ZeRO-3) on a stack of bench/overlap_sharded.h; fills `t` except
// t->start.
absl::Status RunShardedStep(StepMode mode, optim::TrainingStack* stack,
                            const std::vector<RankLayer>& backward, const Config& c, int rank,
                            StepTimes* t);

// One step; fills `t` except t->start.
absl::Status RunStep(StepMode mode, sched::GradientReducer& r, RankOptimizers* opts,
                     const std::vector<RankLayer>& backward, const Config& c, int rank,
                     StepTimes* t);

// Wrong elements of this rank's reduced result: the whole bucket (all-reduce) or this rank's
// shard of it (reduce-scatter, hybrid) must hold the average over all `world_size` ranks.
int64_t CountWrong(const sched::GradientReducer& r, sched::ReduceMode mode, int shard_rank,
                   int world_size);

}  // namespace braid::bench

#endif  // BRAID_BENCH_OVERLAP_STEPS_H_
