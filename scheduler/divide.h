// Divide factors, computed at launch from the group a reduction actually runs on.
//
//   ReduceStep s = StepFor(DType::kF16, /*group_size=*/8);   // premul 1/2, then post-divide 4
//
// Rule: every reduction divides by the size of its own group, so a gradient reduced over the
// shard group only is averaged over the shard group, and one reduced over shard then replica
// groups is averaged over both (the seed on HSDP divide factors: 1/8 after a shard-only
// reduce, 1/32 after both). f32, f64 and bf16 use the backend's avg (sum at group size 1).
// f16 would overflow a plain sum of many ranks, so it is scaled by 1/pre before the sum and
// divided by post after it (pre * post = group size, pre ~ sqrt(group size), FSDP's choice).
#ifndef BRAID_SCHEDULER_DIVIDE_H_
#define BRAID_SCHEDULER_DIVIDE_H_

#include "comm/dtype.h"
#include "comm/reduce_op.h"

namespace braid::sched {

struct ReduceStep {
  ReduceOp op;          // what the collective reduces with
  int post_divide = 1;  // > 1: divide the result by this afterwards (f16)
};

// The f16 pre-divide factor: FSDP's (double p while p divides n and p < n / p, about sqrt n),
// halved until it divides n, so that pre * post is exactly n (FSDP gives 4 for n = 6).
int PreDivideFactor(int group_size);
ReduceStep StepFor(DType dtype, int group_size);
// The override of a join (scheduler/join.h) with torch's divide_by_initial_world_size=False: a
// backward whose average is over the `contributors` ranks that brought gradients (the joined
// ones shadowed it with zeros), in any dtype: the first stage pre-multiplies by 1/contributors
// and sums (torch DDP's grad * (1/n) before its sum), a hybrid replica stage (stage 1) sums.
ReduceStep StepForContributors(int contributors, int stage);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_DIVIDE_H_
