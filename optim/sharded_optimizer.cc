// ShardedOptimizer: creation, the backward calls (BeginBackward, FinishBackward, Step), the
// waits, parameters and hyper-parameters, and Save / Load over optimizer_checkpoint.h (the
// round itself is step_round.cc).
#include "optim/sharded_optimizer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"
#include "optim/global_norm.h"

namespace braid::optim {

using sched::BucketPlan;
using sched::SyncMode;

// Shared with the reduction callbacks: a callback that fires after the optimizer is gone (an
// abandoned backward finishing late) finds self == nullptr.
struct ShardedOptimizer::CallbackGuard {
  std::mutex mu;
  ShardedOptimizer* self = nullptr;
};

ShardedOptimizer::ShardedOptimizer(sched::GradientReducer* reducer, sched::ParamGatherer* gatherer,
                                   const OptimizerConfig& config)
    : reducer_(reducer), gatherer_(gatherer), config_(config), groups_(config.groups) {}

absl::StatusOr<std::unique_ptr<ShardedOptimizer>> ShardedOptimizer::Create(
    sched::GradientReducer* reducer, sched::ParamGatherer* gatherer,
    const OptimizerConfig& config) {
  RETURN_IF_ERROR(CheckOptimizerSetup(reducer, gatherer, config));
  RETURN_IF_ERROR(CheckGlobalNormConfig(config));
  auto opt = std::unique_ptr<ShardedOptimizer>(new ShardedOptimizer(reducer, gatherer, config));
  RETURN_IF_ERROR(opt->Init());
  return opt;
}

absl::Status ShardedOptimizer::Init() {
  const BucketPlan& plan = reducer_->plan();
  Group& shard = *reducer_->groups().shard;
  plan_generation_ = reducer_->plan_generation();
  on_device_ = !plan.buckets().empty() && plan.buckets()[0].device.type != DeviceType::kCpu;
  offload_ = on_device_ && config_.offload;
  const bool global = config_.max_grad_norm > 0 || config_.skip_nonfinite;
  tracked_norm_ = !global && config_.track_grad_norm;
  BufferOps& state_mem = offload_ ? HostBufferOps() : shard.buffer_ops();  // the f32 state's
  ASSIGN_OR_RETURN(shards_, AllocateShards(plan, shard.rank(), config_, state_mem,
                                           offload_ ? &shard.buffer_ops() : nullptr));
  rounds_ = std::vector<BucketRound>(shards_.size());
  ASSIGN_OR_RETURN(agreement_,
                   NormAgreement::Create(shard, on_device_, global, shards_, config_.memory));
  ASSIGN_OR_RETURN(pool_, KernelPool::Create(config_.threads));
  guard_ = std::make_shared<CallbackGuard>();
  guard_->self = this;
  if (config_.overlap) {
    RETURN_IF_ERROR(StartThread(&stepper_, "the optimizer's stepper", [this] { StepperLoop(); }));
  }
  return absl::OkStatus();
}

ShardedOptimizer::~ShardedOptimizer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (stepper_.joinable()) stepper_.join();
  if (guard_ != nullptr) {
    std::lock_guard<std::mutex> lock(guard_->mu);
    guard_->self = nullptr;
  }
}

// ---- backward ---------------------------------------------------------------------------

absl::Status ShardedOptimizer::BeginBackward(SyncMode mode) {
  RETURN_IF_ERROR(WaitRoundIdle("begin_backward"));
  if (reducer_->plan_generation() != plan_generation_) {
    return absl::FailedPreconditionError(
        "optimizer: the reducer rebuilt its buckets after the optimizer was created; create the "
        "gatherer and optimizer again from the new plan");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (InBackward(phase_)) {
      return absl::FailedPreconditionError(
          "optimizer: begin_backward while a backward is in progress");
    }
    if (phase_ == StepPhase::kAwaitingStep) {
      return absl::FailedPreconditionError(
          "optimizer: the last synced backward was not stepped (overlap is off: call step() "
          "before the next backward, or its gradients would be mixed into this one)");
    }
  }
  RETURN_IF_ERROR(reducer_->BeginBackward(mode));
  uint64_t round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = AfterBeginBackward(phase_, mode, config_.overlap);
    if (mode != SyncMode::kSync) return absl::OkStatus();
    round = ++round_;
    for (BucketRound& r : rounds_) {
      r.reduced = false;
      r.reduce_status = absl::OkStatus();
    }
    if (config_.overlap) ArmLocked();
  }
  // Each bucket's final reduction reports here (one small allocation per bucket: the guard).
  for (size_t b = 0; b < rounds_.size(); ++b) {
    reducer_->BucketWork(static_cast<int>(b))
        ->OnComplete([guard = guard_, b, round](const absl::Status& st) {
          std::lock_guard<std::mutex> lock(guard->mu);
          if (guard->self != nullptr) guard->self->OnReduced(static_cast<int>(b), round, st);
        });
  }
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::FinishBackward() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!InBackward(phase_))
      return absl::FailedPreconditionError("optimizer: finish_backward without begin_backward");
  }
  absl::Status s = reducer_->FinishBackward();
  std::lock_guard<std::mutex> lock(mu_);
  const bool synced = phase_ != StepPhase::kAccumulating;
  phase_ = AfterFinishBackward(phase_, config_.overlap);
  if (!synced) return s;
  if (config_.overlap && !s.ok()) {
    // Buckets that will never report (a parameter was never marked, a launch failed): end the
    // step there instead of letting the stepper wait for its deadline.
    for (BucketRound& r : rounds_) {
      if (!r.reduced) {
        r.reduced = true;
        r.reduce_status = s;
      }
    }
    cv_.notify_all();
  }
  return s;
}

absl::Status ShardedOptimizer::Step() {
  if (config_.overlap) {
    return absl::FailedPreconditionError(
        "optimizer: step() with overlap on (steps run as reductions complete)");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (phase_ != StepPhase::kAwaitingStep) {
      return absl::FailedPreconditionError(
          "optimizer: step() without gradients to step: run begin_backward(sync) ... "
          "finish_backward() first (each synced backward is stepped once)");
    }
    phase_ = AfterStepCall(phase_);
    for (size_t b = 0; b < rounds_.size(); ++b) {
      BucketRound& r = rounds_[b];
      const WorkPtr& w = reducer_->BucketWork(static_cast<int>(b));
      if (!r.reduced) {
        r.reduced = true;
        r.reduce_status = w->Done() ? w->status() : absl::FailedPreconditionError("not reduced");
      }
    }
    ArmLocked();
  }
  RunRound();
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(report_.error);
  for (const BucketRound& r : rounds_) RETURN_IF_ERROR(r.publish_status);
  return absl::OkStatus();
}

// ---- waits ------------------------------------------------------------------------------

absl::Status ShardedOptimizer::WaitBetweenSteps(const char* caller) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (InBackward(phase_) || InWindow(phase_) || phase_ == StepPhase::kAwaitingStep) {
      return absl::FailedPreconditionError(
          absl::StrCat("optimizer ", caller,
                       ": only between steps (not inside a backward, an accumulation "
                       "window, or before step() of a finished backward)"));
    }
  }
  return WaitRoundIdle(caller);
}

absl::Status ShardedOptimizer::WaitRoundIdle(const char* caller) {
  std::unique_lock<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + config_.timeout;
  if (!cv_.wait_until(lock, absl::ToChronoTime(deadline), [this] { return !StepArmed(phase_); })) {
    return absl::DeadlineExceededError(absl::StrCat("optimizer ", caller,
                                                    ": the previous step did not finish within ",
                                                    absl::FormatDuration(config_.timeout)));
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::WaitStepped(const char* caller, int b) {
  if (b < 0 || b >= static_cast<int>(rounds_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("optimizer ", caller, ": no bucket ", b, " (", rounds_.size(), " buckets)"));
  }
  BucketRound& r = rounds_[b];
  const std::string& label = shards_[b].label;
  std::unique_lock<std::mutex> lock(mu_);
  if (InBackward(phase_) && !r.published) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer ", caller, " of ", label, " during a synced backward: ", label,
                     " is stepped once its gradients are reduced (wait after finish_backward)"));
  }
  const absl::Time deadline = absl::Now() + config_.timeout;
  if (!cv_.wait_until(lock, absl::ToChronoTime(deadline), [&] { return r.published; })) {
    return absl::DeadlineExceededError(absl::StrCat("optimizer ", caller, ": the step of ", label,
                                                    " did not finish within ",
                                                    absl::FormatDuration(config_.timeout)));
  }
  return r.publish_status;
}

absl::Status ShardedOptimizer::WaitShard(int b, DeviceEvent* ready) {
  RETURN_IF_ERROR(WaitStepped("unit gather", b));
  BucketRound& r = rounds_[b];
  r.dirty = false;  // the gather about to start reads the shard as it is now
  if (ready != nullptr) {
    // The step's completion on the shard group's stream (device); its Work keeps the event
    // valid until the next step of b, which cannot start before this gather was issued.
    *ready = on_device_ && r.step_work != nullptr ? r.step_work->device_event() : DeviceEvent{};
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::WaitParams(int b) {
  RETURN_IF_ERROR(WaitStepped("wait_params", b));
  BucketRound& r = rounds_[b];
  if (config_.fully_sharded) return absl::OkStatus();  // the unit scheduler gathers
  if (r.dirty) {
    r.dirty = false;
    RETURN_IF_ERROR(Regather(b));
  }
  return gatherer_->WaitParams(b);
}

absl::Status ShardedOptimizer::WaitAllParams() {
  absl::Status first;
  for (int b = 0; b < static_cast<int>(rounds_.size()); ++b) {
    absl::Status s = WaitParams(b);
    if (first.ok()) first = s;
  }
  bool inside;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inside = InBackward(phase_);
  }
  // Every bucket is published: the step completes at once, or after track_grad_norm's
  // all-reduce.
  if (first.ok() && !inside) first = WaitRoundIdle("wait_all_params");
  return first;
}

// ---- parameters and hyper-parameters ----------------------------------------------------

absl::Status ShardedOptimizer::SetParam(ParamId id, const void* values) {
  const BucketPlan& plan = reducer_->plan();
  absl::StatusOr<int> i = plan.IndexOf(id);
  if (!i.ok())
    return absl::NotFoundError(absl::StrCat("optimizer set_param: unknown parameter id ", id));
  const sched::ParamSpec& p = plan.params()[*i];
  if (values == nullptr && p.count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer set_param(", p.Label(), "): null values"));
  }
  RETURN_IF_ERROR(WaitBetweenSteps("set_param"));
  const int b = plan.slot(*i).bucket;
  // Fully sharded gathers read the shard (out of place) until they complete.
  if (WorkPtr w = gatherer_->GatherWork(b); w != nullptr && !w->Done()) {
    (void)w->WaitUntil(absl::Now() + config_.timeout);  // its failure is the gather's to report
    if (!w->Done()) {
      return absl::DeadlineExceededError(
          absl::StrCat("optimizer set_param(", p.Label(),
                       "): the gather of its bucket still reads the shard after ",
                       absl::FormatDuration(config_.timeout)));
    }
  }
  RETURN_IF_ERROR(WriteParamShard(plan, *i, values, shard_rank(), shards_[b],
                                  gatherer_->ShardView(b)->data, memory()));
  rounds_[b].dirty = true;
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::AdoptParam(ParamId id) {
  const BucketPlan& plan = reducer_->plan();
  absl::StatusOr<int> i = plan.IndexOf(id);
  if (!i.ok())
    return absl::NotFoundError(absl::StrCat("optimizer adopt_param: unknown parameter id ", id));
  const sched::ParamSpec& p = plan.params()[*i];
  if (config_.fully_sharded) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer adopt_param(", p.Label(),
                     "): a fully_sharded optimizer's parameters are "
                     "written through set_param (e.g. a summon with writeback)"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (InBackward(phase_)) {
      return absl::FailedPreconditionError(
          absl::StrCat("optimizer adopt_param(", p.Label(), "): inside a backward"));
    }
  }
  // Between steps, before Step() of a finished backward (overlap off: the step then starts
  // from the written values, as torch's would) or between the backwards of a window.
  RETURN_IF_ERROR(WaitRoundIdle("adopt_param"));
  const int b = plan.slot(*i).bucket;
  RETURN_IF_ERROR(gatherer_->WaitParams(b));  // no gather writes the shard while we read it
  return AdoptParamShard(plan, *i, shard_rank(), shards_[b], gatherer_->ShardView(b)->data,
                         memory());
}

absl::Status ShardedOptimizer::SetHyper(int group, const GroupHyper& h) {
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return absl::OutOfRangeError(absl::StrCat("optimizer set_hyper: no parameter group ", group));
  }
  RETURN_IF_ERROR(CheckHyper(h, config_.kind, group));
  std::lock_guard<std::mutex> lock(mu_);
  groups_[group] = h;  // the armed step keeps its snapshot
  return absl::OkStatus();
}

int64_t ShardedOptimizer::bucket_steps(int b) const {
  std::lock_guard<std::mutex> lock(mu_);
  return StepArmed(phase_) ? -1 : shards_.at(b).steps;
}

StepReport ShardedOptimizer::last_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return report_;
}

// ---- state ------------------------------------------------------------------------------

StateHeader ShardedOptimizer::SavedHeader() const {
  StateHeader identity = OptimizerIdentity(*reducer_, config_.kind);
  std::lock_guard<std::mutex> lock(mu_);
  return optim::SavedHeader(std::move(identity), report_.rounds, groups_, config_.kind);
}

Checkpoint ShardedOptimizer::EmptyCheckpoint() const {
  return optim::EmptyCheckpoint(SavedHeader(), reducer_->plan(), config_.kind);
}

absl::StatusOr<Checkpoint> ShardedOptimizer::GatherCheckpoint() {
  RETURN_IF_ERROR(WaitBetweenSteps("get_state"));
  Checkpoint c = EmptyCheckpoint();
  const absl::Time deadline = absl::Now() + config_.timeout;
  RETURN_IF_ERROR(GatherShardState(shards_, *reducer_->groups().shard, memory(), deadline, &c));
  return c;
}

absl::Status ShardedOptimizer::Save(const std::string& path) {
  RETURN_IF_ERROR(WaitBetweenSteps("save"));
  return SaveShards(path, SavedHeader(), shards_, reducer_->plan(), config_.kind, memory());
}

absl::Status ShardedOptimizer::Load(const std::string& path) {
  return LoadState(ReadStateFile(path), path);
}

absl::Status ShardedOptimizer::LoadState(absl::StatusOr<LoadedState> source,
                                         const std::string& path) {
  RETURN_IF_ERROR(WaitBetweenSteps("load"));
  // Phase 1: read and validate everything; nothing changes yet.
  ValidatedState state;
  absl::Status mine =
      ValidateState(std::move(source), path, OptimizerIdentity(*reducer_, config_.kind),
                    reducer_->plan(), groups_, config_.kind, shards_, &state);
  // Every rank loads or none does (the re-gather below is collective), and all from the same
  // step: {failed ranks, sum of steps, sum of squared steps} over the shard group, then over the
  // replica group (hybrid); equal steps <=> sum^2 == n * sum of squares.
  const double step = mine.ok() ? static_cast<double>(state.file.header().step) : 0.0;
  double failed = mine.ok() ? 0.0 : 1.0, sum = step, sumsq = step * step, n = 1;
  const absl::Duration timeout = config_.timeout;
  auto sum2 = [this, timeout](Group* g, double* x, double* y) {
    return agreement_->Sum2(*g, x, y, absl::Now() + timeout);
  };
  for (Group* g : {&agreement_->group(), reducer_->groups().replica}) {
    if (g == nullptr) continue;
    double unused = 0;
    RETURN_IF_ERROR(sum2(g, &failed, &sum));
    RETURN_IF_ERROR(sum2(g, &sumsq, &unused));
    n *= g->size();
  }
  if (!mine.ok()) return mine;
  if (failed > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer load(", path, "): ", failed,
                     " other rank(s) could not load their state files; nothing was loaded"));
  }
  if (sum * sum != n * sumsq) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer load(", path,
                     "): the ranks' state files were saved at different steps (this one at ", step,
                     "); nothing was loaded"));
  }
  // Phase 2: apply, write the model-dtype shards, and gather every bucket.
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups_ = state.hyper;
    report_ = StepReport{};
    report_.rounds = state.file.header().step;
  }
  int applied_buckets = 0;
  const absl::Status applied = ApplyState(state, shards_, *gatherer_, reducer_->plan(),
                                          config_.kind, memory(), path, &applied_buckets);
  for (int b = 0; b < applied_buckets; ++b) rounds_[b].dirty = true;  // cleared by each re-gather
  if (on_device_) {
    // The re-gather is collective: a rank whose device copies failed must not skip it alone.
    // Agree on failures first; if any rank failed, no rank gathers and every rank says why.
    double copy_failed = applied.ok() ? 0.0 : 1.0, unused = 0;
    for (Group* g : {&agreement_->group(), reducer_->groups().replica}) {
      if (g == nullptr) continue;
      RETURN_IF_ERROR(sum2(g, &copy_failed, &unused));
    }
    if (!applied.ok()) return applied;
    if (copy_failed > 0) {
      return absl::AbortedError(
          absl::StrCat("optimizer load(", path, "): ", copy_failed,
                       " other rank(s) failed to copy their state to the "
                       "device (their state is partly loaded); no parameters were re-gathered"));
    }
  }
  if (config_.fully_sharded) return absl::OkStatus();  // each bucket's next gather reads it
  for (size_t b = 0; b < shards_.size(); ++b) RETURN_IF_ERROR(Regather(static_cast<int>(b)));
  return absl::OkStatus();
}

}  // namespace braid::optim
