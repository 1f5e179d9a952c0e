// The sharded optimizer's state moved in and out of its shards: parameter values (SetParam,
// AdoptParam), per-rank state files (Save, Load in two phases: validate, then apply) and the
// unsharded Checkpoint (GatherCheckpoint, EmptyCheckpoint). Free functions over the shards;
// the optimizer (sharded_optimizer.h) does the waits between steps and the ranks' agreement.
//
//   ShardMemory mem{&shard_group.buffer_ops(), on_device, offload, timeout};
//   RETURN_IF_ERROR(SaveShards(path, header, shards, plan, kind, mem));
//   ValidatedState v;
//   RETURN_IF_ERROR(ValidateState(ReadStateFile(path), path, identity, plan, groups, kind,
//                                 shards, &v));
//   int applied = 0;
//   RETURN_IF_ERROR(ApplyState(v, shards, gatherer, plan, kind, mem, path, &applied));
//
// Contract: the state file's sections are "bucket_steps" (i64 per bucket), per bucket b
// "bucket<b>/master" plus "bucket<b>/exp_avg" and "bucket<b>/exp_avg_sq" (AdamW) or
// "bucket<b>/momentum" (SGD), each shard_count f32, the layout sections (checkpoint_layout.h),
// and the scalars "groups" and "g<k>/<name>" per hyper-parameter. The plan fingerprint is the
// layout's on the CPU, so a file saved on a device loads on the host and back. Device state is
// copied through `mem.ops` and waited for (Synchronize within mem.timeout) before any host
// buffer it reads or writes goes away. Errors name the file, the bucket or the parameter.
#ifndef BRAID_OPTIM_OPTIMIZER_CHECKPOINT_H_
#define BRAID_OPTIM_OPTIMIZER_CHECKPOINT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/buffer_ops.h"
#include "comm/group.h"
#include "optim/optimizer_options.h"
#include "optim/optimizer_shard.h"
#include "optim/reshard.h"
#include "optim/state_file.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/param_gatherer.h"

namespace braid::optim {

// Where the shards' state lives and how to reach it.
struct ShardMemory {
  BufferOps* ops;          // the shard group's memory operations
  bool on_device;          // the buckets are device memory
  bool offload;            // on_device, and the f32 state is host memory
  absl::Duration timeout;  // every wait
};

// This rank's identity in a state file (kind, plan fingerprint on the CPU, world and rank).
StateHeader OptimizerIdentity(sched::GradientReducer& reducer, OptimizerKind kind);
// `identity` plus the step count and every group's hyper-parameters (Save's header).
StateHeader SavedHeader(StateHeader identity, int64_t rounds, const std::vector<GroupHyper>& groups,
                        OptimizerKind kind);
// A Checkpoint of `plan` with `header` whose values and step counts are all zero.
Checkpoint EmptyCheckpoint(StateHeader header, const sched::BucketPlan& plan, OptimizerKind kind);

// Fills c->values and c->steps (c from EmptyCheckpoint) from every rank's shards: one
// all-gather over `shard_group` per bucket and state buffer, waited for until `deadline`.
absl::Status GatherShardState(const std::vector<OptimizerShard>& shards, Group& shard_group,
                              const ShardMemory& mem, absl::Time deadline, Checkpoint* c);

// Writes this rank's state file.
absl::Status SaveShards(const std::string& path, const StateHeader& header,
                        const std::vector<OptimizerShard>& shards, const sched::BucketPlan& plan,
                        OptimizerKind kind, const ShardMemory& mem);

// A state read and checked against this optimizer; `found` and `steps` point into `file`.
struct ValidatedState {
  LoadedState file;
  std::vector<GroupHyper> hyper;                         // the file's, per group
  std::vector<std::vector<const LoadedSection*>> found;  // [bucket][master, moments...]
  const LoadedSection* steps = nullptr;                  // "bucket_steps"
};

// Load's first phase: reads `source` into *out and checks everything (layout, identity,
// groups, hyper-parameters, step counts, section shapes); changes nothing else.
absl::Status ValidateState(absl::StatusOr<LoadedState> source, const std::string& path,
                           const StateHeader& identity, const sched::BucketPlan& plan,
                           const std::vector<GroupHyper>& groups, OptimizerKind kind,
                           const std::vector<OptimizerShard>& shards, ValidatedState* out);

// Load's second phase: the validated state into the shards (step counts, master weights,
// moments) and the model-dtype shards (the gatherer's ShardView); gathers nothing.
// *applied: the buckets loaded (all of them unless a device copy failed: the error says the
// state is partly loaded).
absl::Status ApplyState(const ValidatedState& state, std::vector<OptimizerShard>& shards,
                        sched::ParamGatherer& gatherer, const sched::BucketPlan& plan,
                        OptimizerKind kind, const ShardMemory& mem, const std::string& path,
                        int* applied);

// SetParam: parameter `index`'s full values (model dtype, host) into this rank's (`rank`'s)
// master weights and model-dtype shard of its bucket. Waits for device copies.
absl::Status WriteParamShard(const sched::BucketPlan& plan, int index, const void* values, int rank,
                             OptimizerShard& shard, void* shard_view, const ShardMemory& mem);

// AdoptParam: this rank's part of parameter `index`, as the framework wrote it into the
// model-dtype shard, widened into the master weights (the moments stay).
absl::Status AdoptParamShard(const sched::BucketPlan& plan, int index, int rank,
                             OptimizerShard& shard, const void* shard_view, const ShardMemory& mem);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_OPTIMIZER_CHECKPOINT_H_
