// TrainingStack: one rank's training stack, built from options and owned as one object: the
// gradient reducer with its timeline, memory count, launch scheduler and buffer pool, then the
// parameter side (gather group, ParamGatherer, ShardedOptimizer and, fully sharded, the
// UnitScheduler). It also re-plans the buckets (DDP's rebuild, the autotuner's trials), carrying
// the optimizer's state over. The C API and the benches build their stacks here.
//
//   StackOptions so;
//   so.reducer.mode = sched::ReduceMode::kReduceScatter;
//   ASSIGN_OR_RETURN(auto stack, TrainingStack::Create(params, {&world, nullptr}, so));
//   ParamOptions po;
//   po.optimizer = OptimizerConfig{};               // std::nullopt: gather only, no step
//   RETURN_IF_ERROR(stack->AddParamSide(po));
//   RETURN_IF_ERROR(stack->optimizer()->SetParam(id, values));
//   RETURN_IF_ERROR(stack->BeginBackward(sched::SyncMode::kSync));
//   ... stack->reducer().MarkReady(id) as gradients become ready ...
//   RETURN_IF_ERROR(stack->FinishBackward());       // the optimizer steps as buckets arrive
//
// Contract: Create, AddParamSide, BuildParamSide and the re-plans are collective over the
// reducer's groups (every rank makes the same calls in the same order) and run between steps.
// The stack takes no lock: a caller sharing the groups with other threads serializes around
// these calls. The parts are exactly what hand wiring gives (same configs, same order), so
// results are bit for bit a hand-wired stack's. Errors name the caller-visible option.
#ifndef BRAID_OPTIM_TRAINING_STACK_H_
#define BRAID_OPTIM_TRAINING_STACK_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "optim/sharded_optimizer.h"
#include "scheduler/autotuner.h"
#include "scheduler/buffer_pool.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/memory_stats.h"
#include "scheduler/op_scheduler.h"
#include "scheduler/param_gatherer.h"
#include "scheduler/timeline.h"
#include "scheduler/unit_scheduler.h"

namespace braid::optim {

// The reducer side. The stack fills reducer.timeline, .memory, .scheduler and .shared_pool.
struct StackOptions {
  sched::ReducerConfig reducer;
  // Non-empty: a Timeline (scheduler/timeline.h) of this prefix for `timeline_rank`, shared by
  // every part (and the memory count's counters).
  std::string timeline_prefix;
  int timeline_rank = 0;
  // A launch scheduler (credit partitions, priorities) for the reducer and the gatherer. The
  // stack fills its timeline and memory; the reducer's timeout is its timeout.
  bool launch_scheduler = false;
  sched::OpSchedulerConfig scheduler;
};

// The parameter side. The stack fills the gatherer's and units' timeline, memory and launch
// scheduler, units.before_gather (the optimizer's WaitShard), and the optimizer's memory and
// fully_sharded.
struct ParamOptions {
  std::optional<OptimizerConfig> optimizer;  // nullopt: gather only (benchmarks of the comm)
  // ZeRO-3 / FSDP: parameters live as shards, gathered unit by unit through a UnitScheduler
  // (`units`), pooled with a shard_gradients reducer's storage on the host.
  bool fully_sharded = false;
  sched::UnitConfig units;
  absl::Duration timeout = absl::Seconds(300);  // the gatherer's deadline
  DeviceStream gather_stream;                   // optional: the gather group's stream
  sched::GatherQuant gather_quant;              // GathererConfig::quant (fully_sharded)
};

// A gather group, gatherer, optimizer and units over one reducer; destroyed in reverse.
struct ParamSide {
  ParamOptions options;
  std::unique_ptr<Group> gather_group;
  std::unique_ptr<sched::ParamGatherer> gatherer;
  std::unique_ptr<ShardedOptimizer> optimizer;  // null: gather only
  std::unique_ptr<sched::UnitScheduler> units;  // fully_sharded only
};

class TrainingStack {
 public:
  // Collective over `groups`: the timeline, memory count, pool, launch scheduler and reducer.
  static absl::StatusOr<std::unique_ptr<TrainingStack>> Create(std::vector<sched::ParamSpec> params,
                                                               sched::ReducerGroups groups,
                                                               const StackOptions& options);
  ~TrainingStack();
  TrainingStack(const TrainingStack&) = delete;
  TrainingStack& operator=(const TrainingStack&) = delete;

  // Builds and installs the parameter side (FailedPrecondition when one is installed, or inside
  // a backward); nothing is installed when it fails. DropParamSide removes it (and what a
  // re-plan retired).
  absl::Status AddParamSide(const ParamOptions& options);
  void DropParamSide();
  // A parameter side over this stack's reducer that the caller owns and drives (a benchmark
  // comparing two optimizers on the same buffers); it must be destroyed before the stack.
  absl::StatusOr<std::unique_ptr<ParamSide>> BuildParamSide(const ParamOptions& options);

  sched::GradientReducer& reducer() const { return *reducer_; }
  sched::MemoryStats& memory() const { return *memory_; }
  sched::Timeline* timeline() const { return timeline_.get(); }       // null: none
  sched::OpScheduler* scheduler() const { return scheduler_.get(); }  // null: none
  bool on_device() const { return on_device_; }
  bool has_param_side() const { return side_ != nullptr; }
  // The installed side's parts (null: none, or lost to a failed re-plan).
  const ParamOptions* param_options() const { return side_ ? &side_->options : nullptr; }
  sched::ParamGatherer* gatherer() const { return side_ ? side_->gatherer.get() : nullptr; }
  ShardedOptimizer* optimizer() const { return side_ ? side_->optimizer.get() : nullptr; }
  sched::UnitScheduler* units() const { return side_ ? side_->units.get() : nullptr; }
  // The installed optimizer; FailedPrecondition when a failed re-plan lost it, or when the
  // side was built without one (gather only).
  absl::StatusOr<ShardedOptimizer*> LiveOptimizer() const;
  // The installed side (with or without an optimizer); FailedPrecondition when there is none
  // or a failed re-plan lost it.
  absl::Status CheckParamSide() const;

  // This rank's piece of parameter `id` inside a shard (FSDP1 use_orig_params' local view, a
  // DTensor's local tensor): elements [offset, offset + count) of the parameter's flat values
  // live at `data` (bucket dtype); count 0 when the parameter lies wholly in other ranks'
  // shards. NotFound for an unknown id.
  struct ShardPiece {
    void* data = nullptr;
    size_t count = 0;
    size_t offset = 0;
  };
  // In the gatherer's shard (ParamGatherer::ShardView): the values the next gather publishes;
  // a gather-only side's framework optimizer writes them between steps. FailedPrecondition
  // without a parameter side.
  absl::StatusOr<ShardPiece> ParamShardPiece(sched::ParamId id) const;
  // In the reducer's averaged gradient shard (GradientReducer::ShardView): meaningful after a
  // synced FinishBackward, until the next backward.
  absl::StatusOr<ShardPiece> GradShardPiece(sched::ParamId id) const;

  // The backward of the optimizer when there is one, else of the reducer. FinishBackward ends
  // the backward even when it fails.
  absl::Status BeginBackward(sched::SyncMode mode);
  absl::Status FinishBackward();
  bool in_backward() const { return in_backward_; }
  // The reducer's ZeroGrads; FailedPrecondition inside a backward.
  absl::Status ZeroGrads();
  // Between steps, on every rank: the reducer and the installed gatherer launch through
  // `scheduler` (not owned; null: none) from now on.
  absl::Status SetScheduler(sched::OpScheduler* scheduler);

  // Re-plans: collective, between steps. Each returns whether the buckets changed; when they
  // did, an installed optimizer is carried over (its whole state gathered, the side rebuilt
  // over the new plan, this rank's part loaded) and every parameter pointer changes; when not
  // (caps giving the same buckets), nothing is rebuilt. FailedPrecondition (naming why) for a
  // fully sharded or device optimizer, shard_gradients, or inside a backward.
  absl::Status CheckReplannable() const;
  // DDP's one-time rebuild from the first backward's readiness order; false: nothing pending.
  absl::StatusOr<bool> RebuildBuckets();
  absl::StatusOr<bool> Replan(size_t bucket_cap_bytes, size_t first_bucket_cap_bytes);
  // One autotuner step boundary (the tuner is created by the first call: bucket caps of 1, 1/8,
  // 1/4, 1/2 and 2 times the reducer's); re-plans when it moves to another candidate.
  struct TuneStep {
    bool replanned = false;
    bool done = false;
  };
  absl::StatusOr<TuneStep> Autotune(absl::Duration step_time);
  const sched::Autotuner* tuner() const { return tuner_.get(); }  // null before Autotune

 private:
  TrainingStack() = default;
  absl::StatusOr<bool> ReplanCaps(size_t bucket_cap_bytes, size_t first_bucket_cap_bytes);
  absl::StatusOr<bool> ReplanCarrying(const std::function<absl::StatusOr<bool>()>& replan);
  absl::StatusOr<ShardPiece> Piece(sched::ParamId id, char* shard) const;

  std::unique_ptr<sched::Timeline> timeline_;  // outlives every part (declared first)
  std::unique_ptr<sched::MemoryStats> memory_;
  std::shared_ptr<sched::BufferPool> pool_;  // shard_gradients on the host
  std::unique_ptr<sched::OpScheduler> scheduler_;
  std::unique_ptr<sched::GradientReducer> reducer_;
  std::unique_ptr<sched::Autotuner> tuner_;
  size_t first_cap_ = 0;  // the reducer's first-bucket cap when the tuner was created
  bool on_device_ = false;
  bool shard_gradients_ = false;  // the reducer keeps only its gradient shards
  std::atomic<bool> in_backward_{false};
  // The gatherer (and group) before the last re-plan: kept until the next one or the side's
  // end, so parameter pointers the framework still holds stay readable until it fetched new ones.
  std::unique_ptr<Group> retired_group_;
  std::unique_ptr<sched::ParamGatherer> retired_gatherer_;
  std::unique_ptr<ParamSide> side_;
  bool side_lost_ = false;  // a failed re-plan left side_ without its optimizer
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_TRAINING_STACK_H_
