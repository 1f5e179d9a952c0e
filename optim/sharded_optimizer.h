// ShardedOptimizer: AdamW (or SGD) over this rank's shard of every bucket, stepped as soon as
// that bucket's reduction completes, with the updated parameters all-gathered through the
// ParamGatherer and waited for only when the framework next reads them (ZeRO-2 / HSDP).
//
//   ASSIGN_OR_RETURN(auto opt, ShardedOptimizer::Create(reducer.get(), gatherer.get(), cfg));
//   for (each parameter) RETURN_IF_ERROR(opt->SetParam(id, initial_values));
//   for (;;) {                                       // one optimizer step
//     for (b in forward order) RETURN_IF_ERROR(opt->WaitParams(b)), forward reads
//         gatherer->ParamView(id) ...;
//     RETURN_IF_ERROR(opt->BeginBackward(SyncMode::kSync));
//     ... backward: accumulate into reducer->GradView(id), reducer->MarkReady(id) ...
//     RETURN_IF_ERROR(opt->FinishBackward());       // reductions done; steps may still run
//   }
//
// Reduce-scatter and hybrid reducers only (ZeRO-1's all-reduce followed by a sharded step
// moves twice the bytes of a reduce-scatter for the same result; an all-reduce reducer steps
// unsharded in the framework). The gatherer must gather the reducer's plan over a group with
// the shard group's ranks in the same order (a Split of the shard group with key = rank), and
// must not be driven by anyone else while a step is in flight.
//
// When a step happens. A BeginBackward(kSync) arms a step: with `overlap` (the default) a
// stepper thread takes bucket k as soon as its reduction completes, in bucket order (the
// reverse layer order of the DistAdam seed falls out of the plan), steps this rank's shard
// into the f32 master weights and moments, writes the model-dtype parameters into the
// gatherer's shard, zeroes the bucket's gradients and starts its all-gather; nothing waits for
// the rest of the backward. Without `overlap` the framework calls Step() after FinishBackward
// (the baseline the seeds describe). kNoSync and kReduceScatterOnly backwards only accumulate;
// the step follows the window's last (kSync) backward, and the gradients are zeroed by it.
// WaitParams(b) waits for bucket b's step and all-gather; BeginBackward waits for the previous
// step to have consumed every gradient shard.
//
// Global-norm clipping (max_grad_norm > 0) and skip_nonfinite need every bucket before any
// step: each bucket's partial sum of squares is taken as its shard arrives, then one 2-double
// all-reduce over the shard group (on the optimizer's own split of it), then the steps. Cost:
// the steps start after the last reduction instead of overlapping it. With skip_nonfinite, a
// step in which any rank saw inf/NaN in its gradient shard changes no parameter and no state
// on any rank (the gradients are still zeroed: the window is dropped, as with loss scaling).
//
// Gradient norm for logging (track_grad_norm, host parameters): without clipping or
// skip_nonfinite the steps do not wait for each other, so the norm is taken bucket by bucket:
// each bucket's shard squared norm is summed right before its step (one extra read of the
// shard: 4 bytes per f32 element against AdamW's 28, on the critical path of that bucket's
// gather), and after the last bucket was published (its gather started) one 2-double
// all-reduce over the optimizer's split of the shard group gives the global norm. The step
// completes (last_step, WaitAllParams) after that all-reduce; WaitParams(b) does not wait for
// it, so the next forward overlaps it. The sum is the one clipping takes (same bits).
//
// Failures: when a bucket's reduction fails (or misses the deadline), that bucket and every later
// one are not stepped on any rank this time (their gradients are dropped, their parameters stay
// as they were and are gathered again, so WaitParams works); earlier buckets were stepped. The
// step's error is in last_step().error (and Step()'s result); FinishBackward returns the
// reduction's. Each bucket counts its own steps (bias correction), so nothing else is lost.
//
// Exactness: the update of each element is optim/adamw_math.h's, bit for bit, whatever the
// thread count.
//
// Device parameters (CUDA buckets on `nccl` groups): master weights and moments are device
// memory allocated through the shard group's BufferOps (comm/buffer_ops.h). When bucket b's
// reduction has completed, its step is queued on the shard group's comm stream: a wait on
// BucketWork(b)->device_event(), then config.device_kernels' fused AdamW / SGD per segment,
// writing the model dtype straight into the gatherer's shard; the bucket is zeroed on the same
// stream, and the all-gather (on the gatherer's stream) waits on an event recorded after the
// step. SetParam copies host values in and waits for the copy.
// max_grad_norm / skip_nonfinite on device: as each bucket's reduction completes, the device
// kernels' NormBlockSums (optim/norm_math.h) write its shard's squared-norm block sums on the
// shard group's stream (8 bytes per 4096 elements); after the last bucket one copy brings them
// all to host memory and the stepper waits once for that stream (Synchronize, with the step's
// deadline: the one host sync of a clipped step), adds the block sums in the host's order
// (the same bits as the host's SquaredNormF64), and the 2-double agreement all-reduce runs in
// device memory on the optimizer's split of the shard group (copied in and out: a second,
// small wait). The clip coefficient is then a scalar of the step
// kernels (grad_scale), as on host; a skipped step queues no kernel.
// Save / Load on device copy master weights and moments through the shard group's BufferOps
// (device -> host and back, each followed by a Synchronize with the timeout); the file is the
// host's, and a file saved on device loads on host and back (the state file records the plan's
// layout as if on the CPU: BucketPlan::FingerprintOn).
#ifndef BRAID_OPTIM_SHARDED_OPTIMIZER_H_
#define BRAID_OPTIM_SHARDED_OPTIMIZER_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "optim/adamw_math.h"
#include "optim/parallel_for.h"
#include "optim/reshard.h"
#include "optim/state_file.h"
#include "optim/step_kernels.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/param_gatherer.h"

namespace braid::optim {

using sched::ParamId;

enum class OptimizerKind { kAdamW, kSgd };

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
  // true (ZeRO-2): each bucket's step is followed by its all-gather. false (fully sharded):
  // the step only writes the updated shard into the gatherer's ShardView; whoever gathers the
  // units before their next use (sched::UnitScheduler) first calls WaitShard(b). Load and
  // SetParam gather nothing either (the next gather of a bucket reads its shard).
  bool gather_after_step = true;
  // Host parameters only: every step's global gradient norm in last_step().grad_norm even
  // without clipping or skip_nonfinite (see "Gradient norm for logging" above). Device
  // parameters: Unimplemented (use max_grad_norm, whose norm is reported too).
  bool track_grad_norm = false;
  // Device parameters only (a no-op on the host): master weights and moments live in host
  // memory (ZeRO-Offload). When bucket b's reduction completes, its reduced shard is copied to
  // a host staging buffer, stepped there by the CPU kernels (the host optimizer's code, so the
  // result is bit for bit the host run's), and the model-dtype shard is copied back into the
  // gatherer's shard on the shard group's stream, ahead of the gather (which waits on the
  // step's event as usual). Host waits: one per bucket (the gradient copy). Clipping and
  // skip_nonfinite take their norms on the device as without offload; Save / Load and SetParam
  // move the host state directly. Costs host memory: the state plus two shard-size staging
  // buffers per bucket.
  bool offload = false;
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

class ShardedOptimizer {
 public:
  // Collective over the reducer's shard group (splits it once for the clipping all-reduce).
  static absl::StatusOr<std::unique_ptr<ShardedOptimizer>> Create(sched::GradientReducer* reducer,
                                                                  sched::ParamGatherer* gatherer,
                                                                  const OptimizerConfig& config);
  ~ShardedOptimizer();
  ShardedOptimizer(const ShardedOptimizer&) = delete;
  ShardedOptimizer& operator=(const ShardedOptimizer&) = delete;

  // Initial value of parameter `id`: its full `count` elements in its model dtype, identical on
  // every rank. Sets this rank's master weights and model-dtype shard; the next WaitParams of
  // its bucket gathers it. Only between steps.
  absl::Status SetParam(ParamId id, const void* values);
  // The framework wrote parameter `id`'s values in place, through the gatherer's ParamView
  // (ZeRO-2: a model.load_state_dict() after the optimizer exists): this rank's part of them,
  // which is this rank's model-dtype shard itself, becomes its master weights (widened; the
  // moments stay). Nothing is gathered: every rank keeps reading what it wrote until the next
  // step's gather publishes each shard from its owner (as torch's ZeroRedundancyOptimizer
  // broadcasts each parameter from its owner). Not collective. Outside a backward (waits for
  // the step in flight; before Step() without overlap the step then starts from the written
  // values); FailedPrecondition for a fully sharded optimizer (its shards are written through
  // SetParam, e.g. by a summon with writeback).
  absl::Status AdoptParam(ParamId id);

  absl::Status BeginBackward(sched::SyncMode mode);
  // The reducer's FinishBackward (every reduction complete, or its error). Does not wait for
  // the steps.
  absl::Status FinishBackward();
  // overlap == false: steps every bucket of the last synced backward now and starts the
  // all-gathers. FailedPrecondition without a finished synced backward to step.
  absl::Status Step();

  // Bucket b's step (if one is armed) and all-gather are complete: its parameters may be read.
  // With gather_after_step off: bucket b's step is complete (its shard is updated); nothing is
  // gathered.
  absl::Status WaitParams(int b);
  // Every bucket's WaitParams; outside a backward also the whole step's completion
  // (track_grad_norm's all-reduce included).
  absl::Status WaitAllParams();
  // For a gatherer of bucket b's shard (gather_after_step off; the UnitScheduler's
  // before_gather hook): returns once the armed step of b, if any, has written b's shard, and
  // sets *ready (may be null) to the event a device gather must wait on first (the step's
  // completion on the shard group's stream; null on the host, where the step is done). The
  // error is the step's (naming the bucket). Call it from a forward, not during a synced
  // backward (b is stepped only after its gradients are reduced: FailedPrecondition).
  absl::Status WaitShard(int b, DeviceEvent* ready);

  // Takes effect from the next armed step.
  absl::Status SetHyper(int group, const GroupHyper& h);
  const GroupHyper& hyper(int group) const { return groups_.at(group); }
  int64_t bucket_steps(int b) const;
  StepReport last_step() const;

  // Per-rank state file: master weights, moments, per-bucket step counts, hyper-parameters.
  // Save waits for the step in flight. Load is collective over the shard group: it restores
  // the state, writes the model-dtype shards and gathers every bucket; it fails, changing
  // nothing, for a file of another plan, world, rank or optimizer kind.
  absl::Status Save(const std::string& path);
  absl::Status Load(const std::string& path);
  // Load of a state already in memory (optim/reshard.h's CheckpointRank: a re-plan of a live
  // run's buckets), `what` naming it in errors. A `source` that is an error fails this rank's
  // load, and so every rank's (the ranks agree first), as an unreadable file would.
  absl::Status LoadState(absl::StatusOr<LoadedState> source, const std::string& what);
  // The whole state, unsharded (optim/reshard.h's Checkpoint: every parameter's master weights
  // and moments, step counts, hyper-parameters), on every rank: collective over the shard group
  // (one all-gather per bucket and state buffer; hybrid replicas hold the same shards). Between
  // steps. For a re-plan of the buckets under the optimizer (capi: a new optimizer over the new
  // plan Loads WriteCheckpointRank's file of it). Costs the state's full size in host memory.
  absl::StatusOr<Checkpoint> GatherCheckpoint();
  // A Checkpoint of this optimizer's parameters and plan whose header is what Save would
  // write (identity, step count, hyper-parameters) and whose values and step counts are all
  // zero (a fresh optimizer's state): for a caller that fills in a state of its own (e.g. a
  // framework's unsharded optimizer state, capi's braid_optimizer_set_state) and loads it with
  // LoadState(CheckpointRank(...)). Local; waits for nothing. Costs the state's full size.
  Checkpoint EmptyCheckpoint() const;

 private:
  struct BucketState;
  struct CallbackGuard;
  ShardedOptimizer(sched::GradientReducer* reducer, sched::ParamGatherer* gatherer,
                   const OptimizerConfig& config);
  absl::Status Init();

  void OnReduced(int b, uint64_t round, const absl::Status& st);
  // With mu_ held: a step of the current backward's gradients is due.
  void ArmLocked();
  void StepperLoop();
  // One armed step: waits for each bucket's reduction (in bucket order), steps and publishes.
  void RunRound();
  // All-reduces (sums) stats_[0..1] over `g` in place; waits until `deadline`. On device the
  // sum runs in stats_dev_ (copied in and out on g's stream).
  absl::Status SumStats(Group& g, absl::Time deadline);
  // Device, clipping / skip_nonfinite: queues b's norm block sums into norm_dev_ (after a wait
  // on the reduction's event); the error names the bucket.
  absl::Status QueueDeviceNorm(int b);
  // The host's per-bucket sum: segments' squared norms added in segment order (on device from
  // the block sums QueueDeviceNorm copied back, once the stream passed them).
  double DeviceBucketSquaredNorm(int b) const;
  // Host: runs the kernels (always OK). Device: queues them on the shard group's stream after
  // a wait on the reduction's event; the error names the bucket.
  absl::Status StepBucket(int b, double grad_scale);
  // offload_: StepBucket's device-to-host-to-device path (optim/offload_step.cc).
  absl::Status OffloadStepBucket(int b, double grad_scale);
  // The CPU kernels over bucket b's segments: `grad` (the shard, bucket dtype, host) into the
  // host state, the model dtype written to `out` (host).
  void HostStep(int b, const char* grad, char* out, double grad_scale);
  double BucketSquaredNorm(int b);
  // Zeroes b's gradients (zero_grads) and starts its all-gather; b's step is then visible to
  // WaitParams. The last bucket's Publish completes the step.
  // `stepped` (device): b's step was queued (its completion event is recorded for the gather);
  // an error there is the bucket's publish error.
  void Publish(int b, bool zero_grads, absl::Status stepped = absl::OkStatus());
  // With mu_ held: the step in flight is complete (report_ takes round_report_).
  void CompleteRoundLocked();
  // track_grad_norm (no clipping, no skip_nonfinite): after the last bucket was published,
  // the all-reduce of the buckets' squared norms (`failed`: this rank dropped buckets, which
  // still takes part), then the step's completion.
  void FinishTrackedRound(double sumsq, bool failed, absl::Time deadline);
  // A reduction failed: buckets b.. are not stepped, only gathered again (same gathers on every
  // rank), and the step reports `s`.
  void DropFrom(int b, const absl::Status& s);
  // Destruction during a step: wake every waiter with Cancelled.
  void Cancel();
  // Starts bucket b's all-gather (after waiting for one nobody waited for).
  absl::Status Regather(int b, DeviceEvent ready = {});
  // The shard group's memory operations (host or device).
  BufferOps& ops() const { return reducer_->groups().shard->buffer_ops(); }
  // Save / Load: this rank's identity in a state file.
  StateHeader Identity() const;
  // Identity() plus the step count and every group's hyper-parameters (Save's header).
  StateHeader SavedHeader() const;
  absl::Status WaitRoundIdle(const char* caller);
  // Waits (deadline) until bucket b's armed step, if any, was published; its error.
  absl::Status WaitStepped(const char* caller, int b);
  // FailedPrecondition inside a backward / accumulation window / before Step(); else waits for
  // the step in flight.
  absl::Status WaitBetweenSteps(const char* caller);

  sched::GradientReducer* const reducer_;
  sched::ParamGatherer* const gatherer_;
  const OptimizerConfig config_;
  bool on_device_ = false;          // the buckets are device memory (ops() is not synchronous)
  bool offload_ = false;            // on_device_ and config.offload: the f32 state is host memory
  std::vector<GroupHyper> groups_;  // current; snapshotted when a step is armed
  std::vector<std::unique_ptr<BucketState>> buckets_;
  // Clipping / non-finite / failure all-reduce: {sum of squares, failed ranks}. On the heap and
  // declared before its group, so an all-reduce that outlived its wait never writes freed memory.
  std::unique_ptr<double[]> stats_;
  OwnedBuffer stats_dev_;  // device: the all-reduce's 2 doubles (shard group's memory)
  // Device, clipping / skip_nonfinite: every bucket's norm block sums (device memory), and
  // their host copy, made by one copy after the last bucket (read after the Synchronize).
  OwnedBuffer norm_dev_;
  std::vector<double> norm_host_;
  std::unique_ptr<Group> stats_group_;
  std::unique_ptr<KernelPool> pool_;
  std::shared_ptr<CallbackGuard> guard_;
  int plan_generation_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool in_backward_ = false;  // guarded by mu_
  sched::SyncMode sync_ = sched::SyncMode::kSync;
  uint64_t round_ = 0;             // guarded by mu_: synced backwards so far
  bool round_armed_ = false;       // guarded by mu_: a step waits to run or is running
  bool round_running_ = false;     // guarded by mu_
  bool stepable_ = false;          // guarded by mu_: !overlap, a synced backward awaits Step()
  bool defer_completion_ = false;  // guarded by mu_: the last Publish does not complete the step
  absl::Time round_deadline_;      // guarded by mu_
  std::vector<GroupHyper> round_hyper_;  // the armed step's hyper-parameters
  StepReport report_;                    // guarded by mu_: the last completed step
  StepReport round_report_;              // guarded by mu_: the step in flight
  bool stop_ = false;                    // guarded by mu_
  std::thread stepper_;                  // overlap only; last member
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_SHARDED_OPTIMIZER_H_
