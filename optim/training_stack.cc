#include "optim/training_stack.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "optim/reshard.h"
#include "scheduler/plan_check.h"

namespace braid::optim {

absl::StatusOr<std::unique_ptr<TrainingStack>> TrainingStack::Create(
    std::vector<sched::ParamSpec> params, sched::ReducerGroups groups,
    const StackOptions& options) {
  std::unique_ptr<TrainingStack> s(new TrainingStack());
  s->memory_ = std::make_unique<sched::MemoryStats>();
  sched::ReducerConfig config = options.reducer;
  if (!options.timeline_prefix.empty()) {
    ASSIGN_OR_RETURN(s->timeline_,
                     sched::Timeline::Create(options.timeline_prefix, options.timeline_rank));
    config.timeline = s->timeline_.get();
    s->memory_->SetTimeline(s->timeline_.get());
  }
  config.memory = s->memory_.get();
  s->on_device_ = std::any_of(params.begin(), params.end(), [](const sched::ParamSpec& p) {
    return p.device.type != DeviceType::kCpu;
  });
  s->shard_gradients_ = config.shard_gradients;
  if (s->shard_gradients_ && !s->on_device_) {
    // Bounded by the reducer's pool_limit_bytes (gathered parameters and gradient storage).
    s->pool_ = std::make_shared<sched::BufferPool>(
        sched::BufferPool::Options{config.pool_limit_bytes, s->memory_.get()});
    config.shared_pool = s->pool_;
  }
  // Before anything whose collectives depend on them (a launch scheduler only some ranks made
  // would pair its config check with another rank's plan check): named as braid.h names them.
  const std::vector<sched::NamedOption> agreed = {
      {"mode", static_cast<int64_t>(config.mode)},
      {"bucket_cap_bytes", static_cast<int64_t>(config.bucket_cap_bytes)},
      {"first_bucket_cap_bytes", static_cast<int64_t>(config.first_bucket_cap_bytes)},
      {"reduce_dtype", static_cast<int64_t>(config.reduce_dtype)},
      {"allow_unused", config.allow_unused ? 1 : 0},
      {"shard_gradients", config.shard_gradients ? 1 : 0},
      {"credit_bytes",
       options.launch_scheduler ? static_cast<int64_t>(options.scheduler.credit_bytes) : 0},
      {"priorities", options.launch_scheduler && options.scheduler.priorities ? 1 : 0}};
  for (Group* g : {groups.shard, groups.replica}) {
    if (g != nullptr) {
      RETURN_IF_ERROR(VerifyOptionsAcrossRanks("reducer options", agreed, *g, config.timeout));
    }
  }
  if (options.launch_scheduler) {
    sched::OpSchedulerConfig sc = options.scheduler;
    sc.timeout = config.timeout;
    sc.timeline = s->timeline_.get();
    sc.memory = s->memory_.get();
    ASSIGN_OR_RETURN(s->scheduler_, sched::OpScheduler::Create(sc, groups.shard));
    config.scheduler = s->scheduler_.get();
  }
  ASSIGN_OR_RETURN(s->reducer_, sched::GradientReducer::Create(std::move(params), groups, config));
  return s;
}

TrainingStack::~TrainingStack() = default;

absl::StatusOr<std::unique_ptr<ParamSide>> TrainingStack::BuildParamSide(
    const ParamOptions& options) {
  auto side = std::make_unique<ParamSide>();
  side->options = options;
  Group& shard = *reducer_->groups().shard;
  ASSIGN_OR_RETURN(side->gather_group, shard.Split(0, shard.rank(), shard.name() + "/gather"));
  if (options.gather_stream.handle != nullptr) {
    absl::Status s = side->gather_group->UseStream(options.gather_stream);
    if (!s.ok()) return WithContext(s, "gather_stream");
  }
  sched::GathererConfig gc;
  gc.timeout = options.timeout;
  gc.timeline = timeline_.get();
  gc.memory = memory_.get();
  gc.fully_sharded = options.fully_sharded;
  gc.quant = options.gather_quant;
  gc.scheduler = scheduler_.get();                    // its gathers are the urgent operations
  if (options.fully_sharded) gc.shared_pool = pool_;  // host: one pool with the gradients
  ASSIGN_OR_RETURN(side->gatherer,
                   sched::ParamGatherer::Create(reducer_->plan(), side->gather_group.get(), gc));
  if (options.optimizer.has_value()) {
    OptimizerConfig oc = *options.optimizer;
    oc.memory = memory_.get();
    oc.fully_sharded = options.fully_sharded;
    ASSIGN_OR_RETURN(side->optimizer,
                     ShardedOptimizer::Create(reducer_.get(), side->gatherer.get(), oc));
  }
  if (!options.fully_sharded) return side;
  sched::UnitConfig uc = options.units;
  uc.timeline = timeline_.get();
  uc.memory = memory_.get();
  if (ShardedOptimizer* opt = side->optimizer.get()) {
    uc.before_gather = [opt](int b, DeviceEvent* ready) { return opt->WaitShard(b, ready); };
  }
  ASSIGN_OR_RETURN(side->units, sched::UnitScheduler::Create(side->gatherer.get(), uc));
  return side;
}

absl::Status TrainingStack::AddParamSide(const ParamOptions& options) {
  if (side_ != nullptr) {
    return absl::FailedPreconditionError("this reducer already has an optimizer");
  }
  if (in_backward_) {
    return absl::FailedPreconditionError("the reducer is inside a backward (finish it first)");
  }
  ASSIGN_OR_RETURN(side_, BuildParamSide(options));
  side_lost_ = false;
  return absl::OkStatus();
}

void TrainingStack::DropParamSide() {
  side_.reset();
  retired_gatherer_.reset();
  retired_group_.reset();
  side_lost_ = false;
}

absl::StatusOr<ShardedOptimizer*> TrainingStack::LiveOptimizer() const {
  if (side_lost_) {
    return absl::FailedPreconditionError(
        "this optimizer was lost when a re-plan of its reducer's buckets failed (see that "
        "call's error); destroy it");
  }
  if (side_ != nullptr && optimizer() == nullptr) {
    return absl::FailedPreconditionError(
        "this parameter side gathers only (created without an optimizer, kind NONE): the "
        "framework steps its shards itself");
  }
  if (optimizer() == nullptr) return absl::FailedPreconditionError("the stack has no optimizer");
  return optimizer();
}

absl::Status TrainingStack::CheckParamSide() const {
  if (side_lost_) return LiveOptimizer().status();
  if (side_ == nullptr) return absl::FailedPreconditionError("the stack has no parameter side");
  return absl::OkStatus();
}

absl::StatusOr<TrainingStack::ShardPiece> TrainingStack::Piece(sched::ParamId id,
                                                               char* shard) const {
  const sched::BucketPlan& plan = reducer_->plan();
  ASSIGN_OR_RETURN(int i, plan.IndexOf(id));
  const sched::ParamSpec& p = plan.params()[i];
  const sched::ParamSlot& slot = plan.slot(i);
  const sched::Bucket& b = plan.buckets()[slot.bucket];
  const size_t start = static_cast<size_t>(reducer_->groups().shard->rank()) * b.shard_count;
  const size_t lo = std::max(slot.offset, start);
  const size_t hi = std::min(slot.offset + p.count, start + b.shard_count);
  ShardPiece piece;
  if (lo >= hi) return piece;  // wholly in other ranks' shards: an empty piece
  piece.data = shard + (lo - start) * DTypeSize(b.dtype);
  piece.count = hi - lo;
  piece.offset = lo - slot.offset;
  return piece;
}

absl::StatusOr<TrainingStack::ShardPiece> TrainingStack::ParamShardPiece(sched::ParamId id) const {
  RETURN_IF_ERROR(CheckParamSide());
  ASSIGN_OR_RETURN(int i, reducer_->plan().IndexOf(id));
  ASSIGN_OR_RETURN(TensorView shard, gatherer()->ShardView(reducer_->plan().slot(i).bucket));
  return Piece(id, static_cast<char*>(shard.data));
}

absl::StatusOr<TrainingStack::ShardPiece> TrainingStack::GradShardPiece(sched::ParamId id) const {
  ASSIGN_OR_RETURN(int i, reducer_->plan().IndexOf(id));
  const TensorView shard = reducer_->ShardView(reducer_->plan().slot(i).bucket);
  return Piece(id, static_cast<char*>(shard.data));
}

absl::Status TrainingStack::BeginBackward(sched::SyncMode mode) {
  ShardedOptimizer* opt = optimizer();
  RETURN_IF_ERROR(opt != nullptr ? opt->BeginBackward(mode) : reducer_->BeginBackward(mode));
  in_backward_ = true;
  return absl::OkStatus();
}

absl::Status TrainingStack::FinishBackward() {
  ShardedOptimizer* opt = optimizer();
  absl::Status s = opt != nullptr ? opt->FinishBackward() : reducer_->FinishBackward();
  in_backward_ = false;
  return s;
}

absl::Status TrainingStack::ZeroGrads() {
  if (in_backward_) {
    return absl::FailedPreconditionError("a backward is in progress (finish it first)");
  }
  return reducer_->ZeroGrads();
}

absl::Status TrainingStack::SetScheduler(sched::OpScheduler* scheduler) {
  if (sched::ParamGatherer* g = gatherer()) g->SetScheduler(scheduler);
  return reducer_->SetScheduler(scheduler);
}

absl::Status TrainingStack::CheckReplannable() const {
  if (side_ != nullptr && (side_->options.fully_sharded || on_device_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "an optimizer was built on this reducer and its state cannot follow a re-plan of the "
        "buckets there (",
        side_->options.fully_sharded ? "fully_sharded" : "device parameters",
        ": not yet); re-plan before creating the optimizer"));
  }
  if (shard_gradients_) {
    return absl::FailedPreconditionError(
        "a shard_gradients reducer does not rebuild its buckets (no full-size storage between "
        "backwards to move gradients through)");
  }
  if (in_backward_) {
    return absl::FailedPreconditionError("a backward is in progress (finish it first)");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TrainingStack::RebuildBuckets() {
  RETURN_IF_ERROR(CheckReplannable());
  if (!reducer_->RebuildPending()) return false;  // local: nothing to rebuild
  sched::GradientReducer& red = *reducer_;
  return ReplanCarrying([&red] { return red.RebuildBucketsIfPending(); });
}

absl::StatusOr<bool> TrainingStack::Replan(size_t bucket_cap_bytes, size_t first_bucket_cap_bytes) {
  RETURN_IF_ERROR(CheckReplannable());
  return ReplanCaps(bucket_cap_bytes, first_bucket_cap_bytes);
}

absl::StatusOr<bool> TrainingStack::ReplanCaps(size_t bucket_cap_bytes,
                                               size_t first_bucket_cap_bytes) {
  sched::GradientReducer& red = *reducer_;
  // Caps giving the same buckets change nothing: the optimizer (if any) is not rebuilt, so
  // every pointer stays valid (the same answer on every rank: plan data only).
  ASSIGN_OR_RETURN(const bool changes, red.ReplanChanges(bucket_cap_bytes, first_bucket_cap_bytes));
  if (!changes) return red.Replan(bucket_cap_bytes, first_bucket_cap_bytes);  // false
  return ReplanCarrying([&red, bucket_cap_bytes, first_bucket_cap_bytes] {
    return red.Replan(bucket_cap_bytes, first_bucket_cap_bytes);
  });
}

absl::StatusOr<TrainingStack::TuneStep> TrainingStack::Autotune(absl::Duration step_time) {
  RETURN_IF_ERROR(CheckReplannable());
  TuneStep out;
  if (tuner_ == nullptr) {
    // Candidates: the reducer's own caps (the default), then bucket caps of 1/8, 1/4, 1/2 and
    // 2x it; no credit partitions. first_cap_: candidates keep it, at most their cap.
    const sched::PlanOptions& po = reducer_->plan().options();
    sched::AutotunerConfig ac;
    for (double f : {1.0, 0.125, 0.25, 0.5, 2.0}) {
      const size_t cap = std::max<size_t>(1, static_cast<size_t>(po.bucket_cap_bytes * f));
      ac.candidates.push_back({cap, 0});
    }
    ac.timeout = reducer_->timeout();
    ac.timeline = timeline_.get();
    ac.replica = reducer_->groups().replica;
    first_cap_ = po.first_bucket_cap_bytes;
    ASSIGN_OR_RETURN(tuner_, sched::Autotuner::Create(reducer_->groups().shard, ac));
  }
  if (tuner_->done()) {
    out.done = true;
    return out;
  }
  ASSIGN_OR_RETURN(bool changed, tuner_->EndStep(step_time));
  if (changed) {
    const size_t cap = tuner_->current().bucket_cap_bytes;
    const size_t first = std::min(first_cap_, cap);
    ASSIGN_OR_RETURN(out.replanned, ReplanCaps(cap, first));
  }
  out.done = tuner_->done();
  return out;
}

absl::StatusOr<bool> TrainingStack::ReplanCarrying(
    const std::function<absl::StatusOr<bool>()>& replan) {
  if (side_ == nullptr || side_lost_ || side_->optimizer == nullptr) {
    ASSIGN_OR_RETURN(bool moved, replan());
    if (side_ == nullptr || side_lost_ || !moved) return moved;
    // A gather-only side follows the new plan (no state to carry).
    ParamOptions options = side_->options;
    retired_gatherer_ = std::move(side_->gatherer);
    retired_group_ = std::move(side_->gather_group);
    side_.reset();
    ASSIGN_OR_RETURN(side_, BuildParamSide(options));
    return true;
  }
  ASSIGN_OR_RETURN(Checkpoint state, side_->optimizer->GatherCheckpoint());  // nothing changed
  // From here a failure leaves the side without its optimizer (LiveOptimizer says so): the
  // ranks failed a collective together, so the job has to stop or rebuild it anyway.
  const ParamOptions options = side_->options;
  side_lost_ = true;
  side_->units.reset();
  side_->optimizer.reset();
  retired_gatherer_ = std::move(side_->gatherer);  // the previous retired ones end here
  retired_group_ = std::move(side_->gather_group);
  // Whether the buckets moved does not matter here: the optimizer is built again anyway.
  RETURN_IF_ERROR(replan().status());
  ASSIGN_OR_RETURN(std::unique_ptr<ParamSide> side, BuildParamSide(options));
  // This rank's part of the state under the new plan, in memory; LoadState is collective (the
  // ranks agree first, so a layout error here fails every rank's load, not only this one's).
  const StateHeader& h = state.header;
  const absl::Status st =
      side->optimizer->LoadState(CheckpointRank(state, reducer_->plan(), h.rank, h.world_size,
                                                "the re-planned optimizer state"),
                                 "the re-planned optimizer state");
  if (!st.ok()) return WithContext(st, "re-plan: carrying the optimizer state over");
  side_ = std::move(side);
  side_lost_ = false;
  // The optimizer was built again (new parameter pointers): the caller fetches them again.
  return true;
}

}  // namespace braid::optim
