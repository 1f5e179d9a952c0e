// OptimizerShard: what the sharded optimizer keeps for this rank's shard of one bucket (f32
// master weights and moments, step count, the parameter-group segments), and ShardStepArgs,
// what one step of it reads and writes. The step functions (host_step.h, device_step.h,
// offload_step.h) and the state's movers (optimizer_checkpoint.h) work on these.
//
//   ASSIGN_OR_RETURN(std::vector<OptimizerShard> shards,
//                    AllocateShards(reducer.plan(), shard_group.rank(), config, ops, nullptr));
//   ++shards[b].steps;
//   HostStep(pool, shards[b], ShardStepArgs{kind, &hyper, dtype, grad, out, 1.0});
//
// Contract: the f32 buffers are allocated through the BufferOps given to AllocateShards (the
// shard group's: device memory on device groups, then only stream-ordered operations and
// kernels touch them; host memory with offload) and zeroed. Segments cover exactly the
// parameters' elements inside the shard; padding between parameters and at the end of the
// bucket is never stepped.
#ifndef BRAID_OPTIM_OPTIMIZER_SHARD_H_
#define BRAID_OPTIM_OPTIMIZER_SHARD_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/buffer_ops.h"
#include "comm/dtype.h"
#include "optim/optimizer_options.h"
#include "optim/param_skips.h"
#include "scheduler/bucket_plan.h"

namespace braid::optim {

// f32 state allocated through the shard group's BufferOps.
struct FloatBuffer {
  OwnedBuffer buf;
  float* get() const { return reinterpret_cast<float*>(buf.get()); }
  explicit operator bool() const { return static_cast<bool>(buf); }
};

struct OptimizerShard {
  std::string label;         // "bucket 3"
  size_t n = 0;              // shard_count
  FloatBuffer master, m, v;  // AdamW: exp_avg, exp_avg_sq; SGD: m = momentum buffer
  // Offload: host staging of the reduced gradient shard and of the stepped model-dtype shard
  // (bucket dtype, n elements each).
  OwnedBuffer grad_host, param_host;
  std::vector<Segment> segments;
  // Parameters a step left alone (no rank used them) and their own step counts (param_skips.h).
  ParamSkips skips;
  int64_t steps = 0;  // updates applied (bias correction); written by the step's runner only
  // Device, clipping / skip_nonfinite: where this bucket's norm block sums (each segment's
  // NormBlocks, back to back) start in NormAgreement's buffers.
  size_t norm_offset = 0;
};

// One step of a shard: the inputs besides the shard's own state.
struct ShardStepArgs {
  OptimizerKind kind;
  const std::vector<GroupHyper>* hyper;  // the armed step's, indexed by Segment::group
  DType dtype;                           // the bucket's: gradients and model-dtype parameters
  const char* grad;                      // the reduced gradient shard
  char* out;                             // the model-dtype shard (the gatherer's ShardView)
  double grad_scale;                     // clipping's factor (1: none)
  // The ranges to step and their counts (ParamSkips::Plan); null: the segments at shard.steps.
  const std::vector<StepRun>* runs = nullptr;
};

// Every bucket's shard of this rank (`rank` in the shard group), its state zeroed, in `state_mem`
// (offload: host memory), counted in config.memory. `staging` (offload: the device group's ops;
// else null): the two host staging buffers per bucket come from its AllocateHost (pinned).
absl::StatusOr<std::vector<OptimizerShard>> AllocateShards(const sched::BucketPlan& plan, int rank,
                                                           const OptimizerConfig& config,
                                                           BufferOps& state_mem,
                                                           BufferOps* staging);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_OPTIMIZER_SHARD_H_
