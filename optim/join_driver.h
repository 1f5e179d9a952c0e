// StackJoinDriver: how a joined rank (scheduler/join.h) shadows a step on a TrainingStack. With
// a sharded optimizer installed (ZeRO-2 / HSDP) a shadow is one of the optimizer's own backwards:
// zero gradients reduced in bucket order, then this rank's shard of each bucket stepped with
// the averaged gradient it received and all-gathered, exactly as an active rank's step, so the
// active ranks' parameters are what the contributing ranks make them. Without one it is the
// reducer's backward.
//
//   ASSIGN_OR_RETURN(auto join, sched::Join::Create(&stack->reducer(), options,
//                                                   StackJoinDriver(*stack)));
//
// Contract: the stack outlives the Join. Each shadow waits for its step's gathers before it
// returns (the joined rank reads nothing, so nothing else would). Fully sharded units (over a
// shard_gradients reducer) may join, but their joined rank shadows a step by running its own
// forward and backward with zero marks: Join::Shadow refuses them (docs/design/join.md).
#ifndef BRAID_OPTIM_JOIN_DRIVER_H_
#define BRAID_OPTIM_JOIN_DRIVER_H_

#include "absl/status/status.h"
#include "optim/training_stack.h"
#include "scheduler/join.h"

namespace braid::optim {

// OK when a Join may run over `stack`; Unimplemented for units without shard_gradients.
absl::Status JoinableStack(const TrainingStack& stack);
sched::JoinDriver StackJoinDriver(TrainingStack& stack);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_JOIN_DRIVER_H_
