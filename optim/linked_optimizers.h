// AddLinkedParamSides: one optimizer over several reducers. Each member TrainingStack (a
// reducer on its own groups: dense parameters on the data-parallel group, experts on an
// expert-data-parallel group, tensor-parallel shards on theirs) gets its parameter side and
// ShardedOptimizer, all sharing one GlobalNorm (optim/global_norm.h): each optimizer still
// steps each of its buckets as that bucket's reduction completes, and clipping,
// skip_nonfinite and track_grad_norm take one norm over every member and tensor-parallel rank.
//
//   ParamOptions po;
//   po.optimizer = cfg;                                 // cfg.overlap stays on
//   std::vector<LinkedMember> m = {{dense_stack.get(), po}, {expert_stack.get(), po}};
//   RETURN_IF_ERROR(AddLinkedParamSides(m, *world, tp_group));
//   ... each stack: BeginBackward, MarkReady, FinishBackward, optimizer()->WaitParams ...
//
// Contract: collective over `span` (every rank of every member, usually the world; one Split)
// and then over each member's groups, in member order; every rank passes the same members in
// the same order. Members must have no parameter side; on failure none is left installed.
// Every member takes part in every synced step (begin and finish a synced backward on all of
// them), or the others wait for its norm until their deadline.
#ifndef BRAID_OPTIM_LINKED_OPTIMIZERS_H_
#define BRAID_OPTIM_LINKED_OPTIMIZERS_H_

#include <vector>

#include "absl/status/status.h"
#include "comm/group.h"
#include "optim/training_stack.h"

namespace braid::optim {

struct LinkedMember {
  TrainingStack* stack = nullptr;
  ParamOptions options;  // with an optimizer; its global_norm and norm_member are set here
  // Its parameters are identical on every rank of the tensor-parallel group and reduced
  // without it (Megatron's layer norms): their norm counts on tensor-parallel rank 0 only.
  bool tp_replicated = false;
};

absl::Status AddLinkedParamSides(const std::vector<LinkedMember>& members, Group& span,
                                 Group* tensor_parallel);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_LINKED_OPTIMIZERS_H_
