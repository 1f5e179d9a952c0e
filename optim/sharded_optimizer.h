// ShardedOptimizer: AdamW (or SGD) over this rank's shard of every bucket, stepped as soon as
// that bucket's reduction completes, with the updated parameters all-gathered through the
// ParamGatherer and waited for only when the framework next reads them (ZeRO-2 / HSDP; with
// OptimizerConfig::fully_sharded, ZeRO-3: the step writes shards and units gather them).
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
// Contract:
//  - Reduce-scatter and hybrid reducers only. The gatherer gathers the reducer's plan over a
//    Split of the shard group (key = rank) and is driven by nobody else while a step runs.
//  - A BeginBackward(kSync) arms a step; with `overlap` each bucket is stepped in bucket order
//    as its reduction completes (else Step() after FinishBackward). kNoSync and
//    kReduceScatterOnly backwards only accumulate. WaitParams(b) waits for b's step and gather.
//  - Clipping / skip_nonfinite: every rank takes the same decision (one 2-double all-reduce
//    over the optimizer's split of the shard group); the steps then follow the last reduction.
//  - A failed reduction drops that bucket's and every later bucket's step on every rank
//    (parameters unchanged, gathered again); the error is in last_step().error and Step()'s.
//  - Each element's update is optim/adamw_math.h's, bit for bit, on host, device or offload.
//  - Save / Load are per rank; Load is collective and changes nothing unless every rank can.
// The round state (optim/step_phase.h), the steps (host_step.h, device_step.h,
// offload_step.h), the norm agreement (norm_agreement.h) and the state's movers
// (optimizer_checkpoint.h) are their own files; docs/design/optimizer.md tells the whole story.
#ifndef BRAID_OPTIM_SHARDED_OPTIMIZER_H_
#define BRAID_OPTIM_SHARDED_OPTIMIZER_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "optim/norm_agreement.h"
#include "optim/optimizer_checkpoint.h"
#include "optim/optimizer_options.h"
#include "optim/optimizer_shard.h"
#include "optim/parallel_for.h"
#include "optim/reshard.h"
#include "optim/state_file.h"
#include "optim/step_phase.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/param_gatherer.h"

namespace braid::optim {

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
  // (ZeRO-2: a model.load_state_dict() after the optimizer exists): this rank's part of them
  // becomes its master weights (widened; the moments stay). Nothing is gathered: every rank
  // reads what it wrote until the next step's gather publishes each shard from its owner. Not
  // collective. Outside a backward (waits for the step in flight); FailedPrecondition when
  // fully_sharded (its shards are written through SetParam, e.g. by a summon with writeback).
  absl::Status AdoptParam(ParamId id);

  absl::Status BeginBackward(sched::SyncMode mode);
  // The reducer's FinishBackward (every reduction complete, or its error). Does not wait for
  // the steps.
  absl::Status FinishBackward();
  // overlap == false: steps every bucket of the last synced backward now and starts the
  // all-gathers. FailedPrecondition without a finished synced backward to step.
  absl::Status Step();

  // Bucket b's step (if one is armed) and all-gather are complete: its parameters may be read.
  // fully_sharded: bucket b's step is complete (its shard is updated); nothing is gathered.
  absl::Status WaitParams(int b);
  // Every bucket's WaitParams; outside a backward also the whole step's completion
  // (track_grad_norm's all-reduce included).
  absl::Status WaitAllParams();
  // For a gatherer of bucket b's shard (fully_sharded; the UnitScheduler's before_gather
  // hook): returns once the armed step of b, if any, has written b's shard, and sets *ready
  // (may be null) to the event a device gather must wait on first (null on the host). The
  // error is the step's (naming the bucket). FailedPrecondition during a synced backward.
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
  // Load of a state already in memory (optim/reshard.h's CheckpointRank), `what` naming it in
  // errors. A `source` that is an error fails every rank's load (the ranks agree first).
  absl::Status LoadState(absl::StatusOr<LoadedState> source, const std::string& what);
  // The whole state, unsharded, on every rank: collective over the shard group (one all-gather
  // per bucket and state buffer). Between steps. Costs the state's full size in host memory.
  absl::StatusOr<Checkpoint> GatherCheckpoint();
  // A Checkpoint of this optimizer's parameters and plan with Save's header and all-zero values
  // and step counts (a fresh optimizer's state), for a caller that fills in a state of its own
  // and loads it with LoadState(CheckpointRank(...)). Local. Costs the state's full size.
  Checkpoint EmptyCheckpoint() const;

 private:
  // Per bucket, the armed step's progress (guarded by mu_) and its device completion.
  struct BucketRound {
    bool reduced = true;
    absl::Status reduce_status;
    bool published = true;
    absl::Status publish_status;
    bool dirty = false;  // SetParam / Load changed the shard: the next WaitParams re-gathers
    // Device: the latest step's completion on the shard group's stream (its event is what the
    // all-gather waits on; held so the event stays valid until the gather was queued).
    WorkPtr step_work;
  };
  struct CallbackGuard;
  ShardedOptimizer(sched::GradientReducer* reducer, sched::ParamGatherer* gatherer,
                   const OptimizerConfig& config);
  absl::Status Init();

  // ---- the round (step_round.cc)
  void OnReduced(int b, uint64_t round, const absl::Status& st);
  // With mu_ held: a step of the current backward's gradients is due.
  void ArmLocked();
  void StepperLoop();
  // One armed step: waits for each bucket's reduction (in bucket order), steps and publishes.
  void RunRound();
  // Host: runs the kernels (always OK). Device: queues them on the shard group's stream after
  // a wait on the reduction's event; the error names the bucket.
  absl::Status StepBucket(int b, double grad_scale);
  // agree_unused reducers: waits for the step's used map and sets round_used_ (param_skips.h).
  absl::Status WaitUsedMap(absl::Time deadline);
  // Zeroes b's gradients (zero_grads) and starts its all-gather; b's step is then visible to
  // WaitParams. The last bucket's Publish completes the step (track_grad_norm: its all-reduce
  // does). `stepped` (device): b's step was queued; an error there is the bucket's.
  void Publish(int b, bool zero_grads, absl::Status stepped = absl::OkStatus());
  // With mu_ held: the step in flight is complete (report_ takes round_report_).
  void CompleteRoundLocked();
  // track_grad_norm: after the last bucket was published, the all-reduce of the buckets'
  // squared norms (`failed`: this rank dropped buckets, which still takes part), then the
  // step's completion.
  void FinishTrackedRound(double sumsq, bool failed, absl::Time deadline);
  // The all-reduce of {sum of squares, failed} of a step's norm: over the optimizer's split of
  // the shard group, or through config.global_norm's span; NormGroupName names either.
  absl::Status SumNorm(double* sumsq, double* failed, absl::Time deadline);
  const std::string& NormGroupName() const;
  // A reduction failed: buckets b.. are not stepped, only gathered again (same gathers on every
  // rank), and the step reports `s`.
  void DropFrom(int b, const absl::Status& s);
  // Destruction during a step: wake every waiter with Cancelled.
  void Cancel();
  // Starts bucket b's all-gather (after waiting for one nobody waited for).
  absl::Status Regather(int b, DeviceEvent ready = {});

  // ---- waits
  absl::Status WaitRoundIdle(const char* caller);
  // Waits (deadline) until bucket b's armed step, if any, was published; its error.
  absl::Status WaitStepped(const char* caller, int b);
  // FailedPrecondition inside a backward / accumulation window / before Step(); else waits for
  // the step in flight.
  absl::Status WaitBetweenSteps(const char* caller);

  // The shard group's memory operations (host or device).
  BufferOps& ops() const { return reducer_->groups().shard->buffer_ops(); }
  ShardMemory memory() const { return ShardMemory{&ops(), on_device_, offload_, config_.timeout}; }
  int shard_rank() const { return reducer_->groups().shard->rank(); }
  // Save's header: identity, step count, every group's hyper-parameters.
  StateHeader SavedHeader() const;

  sched::GradientReducer* const reducer_;
  sched::ParamGatherer* const gatherer_;
  const OptimizerConfig config_;
  bool on_device_ = false;  // the buckets are device memory (ops() is not synchronous)
  bool offload_ = false;    // on_device_ and config.offload: the f32 state is host memory
  // track_grad_norm without clipping or skip_nonfinite: a step completes after its norm's
  // all-reduce, not at the last bucket's Publish.
  bool tracked_norm_ = false;
  std::vector<GroupHyper> groups_;  // current; snapshotted when a step is armed
  std::vector<OptimizerShard> shards_;
  std::vector<BucketRound> rounds_;
  std::unique_ptr<NormAgreement> agreement_;
  std::unique_ptr<KernelPool> pool_;
  std::shared_ptr<CallbackGuard> guard_;
  int plan_generation_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  StepPhase phase_ = StepPhase::kIdle;   // guarded by mu_
  uint64_t round_ = 0;                   // guarded by mu_: synced backwards so far
  absl::Time round_deadline_;            // guarded by mu_
  std::vector<GroupHyper> round_hyper_;  // the armed step's hyper-parameters
  const uint8_t* round_used_ = nullptr;  // the armed step's agreed used map (null: all used)
  StepReport report_;                    // guarded by mu_: the last completed step
  StepReport round_report_;              // guarded by mu_: the step in flight
  bool stop_ = false;                    // guarded by mu_: the destructor runs
  std::thread stepper_;                  // overlap only; last member
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_SHARDED_OPTIMIZER_H_
