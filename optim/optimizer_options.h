// The sharded optimizer's options (OptimizerConfig), per-group hyper-parameters, the report of a
// completed step, and the checks Create runs on them.
//
//   OptimizerConfig cfg;
//   cfg.groups[0].adamw.lr = 3e-4;
//   cfg.max_grad_norm = 1.0;            // exact global-norm clipping
//   cfg.fully_sharded = true;           // ZeRO-3: the step writes shards; units gather them
//   ASSIGN_OR_RETURN(auto opt, ShardedOptimizer::Create(reducer, gatherer, cfg));
//
// Contract: the names here are the C API's and Python's (braid_optimizer_options_t,
// braid.Optimizer), and so are the names in every error these checks return. What each option
// changes in a step is told in docs/design/optimizer.md.
#ifndef BRAID_OPTIM_OPTIMIZER_OPTIONS_H_
#define BRAID_OPTIM_OPTIMIZER_OPTIONS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "optim/adamw_math.h"
#include "optim/step_kernels.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/memory_stats.h"
#include "scheduler/param_gatherer.h"

namespace braid::optim {

using sched::ParamId;

enum class OptimizerKind { kAdamW, kSgd };

class GlobalNorm;  // optim/global_norm.h

// Hyper-parameters of one parameter group (the rule's half is used).
struct GroupHyper {
  AdamWHyper adamw;
  SgdHyper sgd;
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  std::vector<GroupHyper> groups = std::vector<GroupHyper>(1);  // group 0: every unlisted parameter
  absl::flat_hash_map<ParamId, int> group_of;                   // parameter id -> index into groups
  bool overlap = true;          // step each bucket as its reduction completes; else Step()
  double max_grad_norm = 0.0;   // > 0: exact global-norm clipping (as torch's clip_grad_norm_)
  bool skip_nonfinite = false;  // drop the whole step on every rank if any gradient is inf/NaN
  int threads = 1;              // kernel threads per step (1: the stepper thread alone)
  absl::Duration timeout = absl::Seconds(300);  // every wait
  // Required when the parameters are on a device: the step kernels to queue on the shard
  // group's stream (optim::CudaStepKernels() from cuda_step_kernels.h, or a fake in tests).
  std::shared_ptr<DeviceStepKernels> device_kernels;
  // Optional, not owned, must outlive the optimizer's buffers: counts master weights and
  // moments (kOptimizerState) and the statistics buffers (kStaging).
  sched::MemoryStats* memory = nullptr;
  // false (ZeRO-2): each bucket's step is followed by its all-gather. true (ZeRO-3 / FSDP,
  // with a gatherer whose GathererConfig::fully_sharded is set): the step only writes the
  // updated shard into the gatherer's ShardView; whoever gathers the units before their next
  // use (sched::UnitScheduler) first calls WaitShard(b). Load and SetParam gather nothing
  // either (the next gather of a bucket reads its shard).
  bool fully_sharded = false;
  // Host parameters only: every step's global gradient norm in last_step().grad_norm even
  // without clipping or skip_nonfinite. Device parameters: Unimplemented (use max_grad_norm,
  // whose norm is reported too).
  bool track_grad_norm = false;
  // Device parameters only (a no-op on the host): master weights and moments live in host
  // memory (ZeRO-Offload); each bucket's reduced shard is stepped there by the CPU kernels.
  // Costs host memory: the state plus two shard-size staging buffers per bucket.
  bool offload = false;
  // Optional (optim/global_norm.h): this optimizer is member `norm_member` of a norm shared
  // with the optimizers of other reducers (experts, tensor-parallel shards): clipping,
  // skip_nonfinite and track_grad_norm then take one norm over all of them. Needs overlap.
  std::shared_ptr<GlobalNorm> global_norm;
  int norm_member = 0;
};

// What the latest completed step did.
struct StepReport {
  int64_t rounds = 0;     // armed steps completed (skipped ones included)
  bool skipped = false;   // skip_nonfinite dropped it
  double grad_norm = -1;  // global gradient norm (clipping / skip_nonfinite /
                          // track_grad_norm only; else -1)
  double clip_scale = 1;  // the factor the gradients were multiplied by
  // Not OK when a reduction failed (or timed out) on any rank: from the first failed bucket on,
  // the step was dropped on every rank (gradients zeroed, parameters unchanged and gathered
  // again); earlier buckets were stepped. Names the bucket.
  absl::Status error;
};

// InvalidArgument naming the group and the hyper-parameter out of range.
absl::Status CheckHyper(const GroupHyper& h, OptimizerKind kind, int group);

// ShardedOptimizer::Create's checks of its arguments: the reducer's mode and plan, the
// gatherer's plan and group, the options (every group's hyper-parameters included).
absl::Status CheckOptimizerSetup(sched::GradientReducer* reducer, sched::ParamGatherer* gatherer,
                                 const OptimizerConfig& config);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_OPTIMIZER_OPTIONS_H_
