#include "optim/join_driver.h"

#include "comm/status_macros.h"

namespace braid::optim {

absl::Status JoinableStack(const TrainingStack& stack) {
  const bool sharded = stack.units() != nullptr ||
                       (stack.param_options() != nullptr && stack.param_options()->fully_sharded);
  if (sharded && !stack.reducer().config().shard_gradients) {
    return absl::UnimplementedError(
        "join: fully sharded units over a reducer without shard_gradients cannot join; a rank "
        "that runs out of data must stop every rank (throw_on_early_termination) or the ranks "
        "must get even inputs");
  }
  // Fully sharded units over a shard_gradients reducer: the join agrees and ends here, and the
  // framework shadows each step itself (sched::Join::Shadow refuses; docs/design/join.md).
  return absl::OkStatus();
}

sched::JoinDriver StackJoinDriver(TrainingStack& stack) {
  sched::JoinDriver d;
  d.begin = [&stack](sched::SyncMode mode) { return stack.BeginBackward(mode); };
  d.finish = [&stack](sched::SyncMode mode) -> absl::Status {
    RETURN_IF_ERROR(stack.FinishBackward());
    ShardedOptimizer* opt = stack.optimizer();
    if (opt == nullptr || mode != sched::SyncMode::kSync) return absl::OkStatus();
    if (!stack.param_options()->optimizer->overlap) RETURN_IF_ERROR(opt->Step());
    return opt->WaitAllParams();
  };
  d.quiesce = [&stack]() -> absl::Status {
    RETURN_IF_ERROR(JoinableStack(stack));
    ShardedOptimizer* opt = stack.optimizer();
    return opt == nullptr ? absl::OkStatus() : opt->WaitAllParams();
  };
  return d;
}

}  // namespace braid::optim
