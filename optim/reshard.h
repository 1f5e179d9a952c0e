// Re-sharding optimizer checkpoints: the per-rank state files a run of N ranks saved
// (ShardedOptimizer::Save, any replicas x shards mesh) become the files a run of M ranks with
// the same parameters loads (ShardedOptimizer::Load), with master weights, moments and step
// counts bit for bit what they were.
//
//   ASSIGN_OR_RETURN(Checkpoint c, ReadCheckpoint({"/ckpt/rank0.braid", "/ckpt/rank1.braid"}));
//   ASSIGN_OR_RETURN(std::vector<std::string> out, WriteCheckpoint(c, /*ranks=*/4,
//                                                                  /*shards=*/4, "/ckpt4/rank"));
//   // out = {"/ckpt4/rank0.braid", ..., "/ckpt4/rank3.braid"}
//
// How: every file records the plan it was saved with (optim/checkpoint_layout.h). Reading puts
// each parameter's state back together from the shard ranks' files (checking that all files
// are one checkpoint and that replica ranks agree bit for bit); writing lays it out again by
// the target plan, BucketPlan::Build of the same parameters and plan options with
// `shards` shards, which is the plan a target run's reducer builds from the same parameters
// and bucket caps. Padding is zero, as a fresh optimizer's. Hyper-parameters, parameter groups
// and the step are carried over unchanged.
//
// Errors name the file and the item: NotFound (a file, or a file without layout: saved by an
// older Braid), DataLoss (corrupt; replicas that disagree), FailedPrecondition (files of
// different runs, steps or parameters, naming the first parameter that differs; a set that
// is not ranks 0..N-1 of one world; target buckets whose parameters have different step
// counts), InvalidArgument (ranks < 1, shards not dividing ranks).
#ifndef BRAID_OPTIM_RESHARD_H_
#define BRAID_OPTIM_RESHARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "optim/state_file.h"
#include "scheduler/bucket_plan.h"

namespace braid::optim {

// A whole checkpoint, unsharded: per state buffer, per parameter (registration order) its
// f32 values.
struct Checkpoint {
  StateHeader header;                    // rank 0's; kind, step and scalars are what carry over
  sched::BucketPlan plan;                // the plan it was saved with
  std::vector<std::string> state_names;  // "master", "exp_avg", "exp_avg_sq" | "master", "momentum"
  std::vector<std::vector<std::vector<float>>> values;  // [state][param][element]
  std::vector<int64_t> steps;                           // per parameter: its bucket's step count
};

// Reads the N files of one checkpoint (any order; together ranks 0..N-1 of one world).
absl::StatusOr<Checkpoint> ReadCheckpoint(const std::vector<std::string>& paths);

// Writes the checkpoint for `ranks` ranks, `shards` of them per shard group (hybrid when
// shards < ranks), as "<prefix><rank>.braid"; returns the paths in rank order.
absl::StatusOr<std::vector<std::string>> WriteCheckpoint(const Checkpoint& c, int ranks, int shards,
                                                         const std::string& prefix);

// Rank `rank`'s state of the checkpoint laid out by `plan` (any plan of the same parameters:
// other bucket caps, another bucket order, another shard count; `ranks` ranks in shard groups
// of plan.options().shards), in memory, exactly what its state file would hold (`name` stands
// for the file in errors): what ShardedOptimizer::LoadState takes when the buckets of a live
// run are re-planned (capi). FailedPrecondition for other parameters (named) or a target bucket
// whose parameters were stepped a different number of times.
absl::StatusOr<LoadedState> CheckpointRank(const Checkpoint& c, const sched::BucketPlan& plan,
                                           int rank, int ranks, const std::string& name);
// CheckpointRank written to `path` (WriteCheckpoint's, for each rank).
absl::Status WriteCheckpointRank(const Checkpoint& c, const sched::BucketPlan& plan, int rank,
                                 int ranks, const std::string& path);

// The state buffers an optimizer of `kind` ("adamw" or "sgd") saves per bucket.
absl::StatusOr<std::vector<std::string>> StateNames(const std::string& kind);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_RESHARD_H_
