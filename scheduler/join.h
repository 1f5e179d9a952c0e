// Join: uneven inputs over a GradientReducer, with the meaning of torch DDP's
// model.join(divide_by_initial_world_size, enable, throw_on_early_termination). A rank that ran
// out of data keeps shadowing the others' backwards with zero gradients (the reducer's bucket
// reductions, and through a JoinDriver a sharded optimizer's shard steps and gathers) until
// every rank has joined, so the active ranks' results are what the contributing ranks make them.
//
//   ASSIGN_OR_RETURN(auto join, Join::Create(reducer.get(), JoinOptions{}));
//   while (have_data) {                                // every step, on every rank
//     ASSIGN_OR_RETURN(JoinStep s, join->Agree(true, SyncMode::kSync));
//     ... forward, BeginBackward, MarkReady ..., FinishBackward, step ...
//   }
//   ASSIGN_OR_RETURN(bool last, join->RunJoined());    // shadows until every rank joined
//   ASSIGN_OR_RETURN(int root, join->AuthoritativeRank(last));
//   RETURN_IF_ERROR(join->Broadcast(params, n, DType::kF32, root));  // torch's final sync
//
// RANK-ORDER CONTRACT: Agree is one small all-reduce over the reducer's groups (the shard
// group, then in hybrid mode the replica group), called once per step by every rank at the same
// point: between steps, on the thread that drives the backward, before BeginBackward. Nothing
// else of the reducer's may be in flight on those groups then.
// Divide: by default the reducer keeps averaging over the whole world (joined ranks add
// zeros); with divide_by_initial_world_size = false each step's Agree sets the reducer's
// contributors to the active count (GradientReducer::SetContributors). throw_on_early_termination:
// the first Agree with a joined rank fails on every rank (OutOfRange), as torch raises.
// shard_gradients reducers (fully sharded units): Agree and the end work, Shadow does not
// (Unimplemented): the framework's joined rank runs its forward and backward with zero marks.
// docs/design/join.md tells the whole protocol.
#ifndef BRAID_SCHEDULER_JOIN_H_
#define BRAID_SCHEDULER_JOIN_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "comm/buffer_ops.h"
#include "comm/reduce_op.h"
#include "scheduler/gradient_reducer.h"

namespace braid::sched {

struct JoinOptions {
  bool divide_by_initial_world_size = true;
  bool throw_on_early_termination = false;
};

// What runs one backward on this rank; the default (null members) is the reducer's own
// BeginBackward / FinishBackward. A sharded optimizer supplies its own (optim/join_driver.h).
struct JoinDriver {
  std::function<absl::Status(SyncMode)> begin;
  // The backward begun in `mode` ends with its results in place (an optimizer's steps too).
  std::function<absl::Status(SyncMode)> finish;
  std::function<absl::Status()> quiesce;  // nothing reads or writes the buckets afterwards
};

struct JoinStep {
  int active = 0;                   // ranks with data this step; 0: every rank has joined
  SyncMode mode = SyncMode::kSync;  // the active ranks' backward of this step
};

// Collective over `reducer`'s groups: `buf` (count elements of memory they reduce) from world
// rank `root` (Join::world_rank's numbering) to every rank; hybrid: through the shard group,
// then the replica group. What Join::Broadcast does, without a join.
absl::Status BroadcastOverWorld(const GradientReducer& reducer, void* buf, size_t count,
                                DType dtype, int root);

class Join {
 public:
  // Local (nothing collective). `reducer` (and what the driver drives) outlives the Join; on
  // destruction the reducer's divide override is cleared.
  static absl::StatusOr<std::unique_ptr<Join>> Create(GradientReducer* reducer, JoinOptions options,
                                                      JoinDriver driver = {});
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  int world_size() const;
  int world_rank() const;  // replica rank * shard size + shard rank (hybrid), else shard rank

  // Collective: this rank has data for a step whose backward runs in `mode` (has_data), or has
  // joined (mode ignored). Every active rank must pass the same mode (else InvalidArgument on
  // every rank). Sets the reducer's divide for the step.
  absl::StatusOr<JoinStep> Agree(bool has_data, SyncMode mode);
  // A joined rank, after Agree(false, ...) returned `step` with step.active > 0: runs the
  // step's backward with zero gradients (nothing for kNoSync), in bucket order in every mode.
  absl::Status Shadow(const JoinStep& step);
  // Agree(false) and Shadow until every rank joined; true when this rank joined in the last
  // step (torch's is_last_joiner: no step was shadowed).
  absl::StatusOr<bool> RunJoined();
  // Collective: the authoritative copy of the model after the join, the largest world_rank()
  // among the last joiners (torch's _find_common_rank). Clears the divide override.
  absl::StatusOr<int> AuthoritativeRank(bool is_last_joiner);
  // Collective: `buf` (count elements of memory the reducer's groups reduce) from world rank
  // `root` to every rank (hybrid: through the shard group, then the replica group).
  absl::Status Broadcast(void* buf, size_t count, DType dtype, int root);

 private:
  Join(GradientReducer* reducer, JoinOptions options, JoinDriver driver);
  // Reduces `n` (<= 4) doubles over the reducer's world with `op`, in place.
  absl::Status SumOverWorld(double* v, int n, ReduceOp op);
  Group* replica() const;  // hybrid mode's replica group, else null

  GradientReducer* const reducer_;
  const JoinOptions options_;
  JoinDriver driver_;
  std::unique_ptr<double[]> host_;  // the agreement's buffer (leaked if a wait times out)
  OwnedBuffer device_;              // its device copy (device groups)
  bool on_device_ = false;
  // The accumulation window the shadows are in: a reduce_scatter_only backward since the last
  // synced one leaves the gradients consumed and partial shards kept, which must not be zeroed.
  bool in_partial_window_ = false;
  bool local_sums_ = false;  // a no_sync backward of this rank's own since the last sync
  int last_contributors_ = -1;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_JOIN_H_
