#include "optim/sharded_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/check.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"
#include "comm/thread_start.h"
#include "optim/adamw_kernel.h"
#include "optim/norm_math.h"
#include "optim/optimizer_bucket.h"

namespace braid::optim {
namespace {

using sched::Bucket;
using sched::BucketPlan;
using sched::ReduceMode;
using sched::SyncMode;

// n zeroed floats in the shard group's memory (device: the memset is queued on its stream,
// ahead of every step).
absl::StatusOr<FloatBuffer> ZeroedFloats(sched::MemoryStats* memory, BufferOps& ops, size_t n,
                                         const std::string& what) {
  const size_t bytes = std::max<size_t>(64, (n * sizeof(float) + 63) / 64 * 64);
  FloatBuffer f;
  ASSIGN_OR_RETURN(
      f.buf, sched::CountedAllocate(memory, ops, bytes, sched::MemoryUse::kOptimizerState, what));
  RETURN_IF_ERROR(ops.Zero(f.buf.get(), bytes));
  return f;
}

}  // namespace

absl::Status CheckHyper(const GroupHyper& h, OptimizerKind kind, int group) {
  const auto bad = [group](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: parameter group ", group, ": ", what));
  };
  if (kind == OptimizerKind::kAdamW) {
    const AdamWHyper& a = h.adamw;
    if (!(a.lr >= 0)) return bad(absl::StrCat("lr must be >= 0, got ", a.lr));
    if (!(a.beta1 >= 0 && a.beta1 < 1))
      return bad(absl::StrCat("beta1 must be in [0, 1), got ", a.beta1));
    if (!(a.beta2 >= 0 && a.beta2 < 1))
      return bad(absl::StrCat("beta2 must be in [0, 1), got ", a.beta2));
    if (!(a.eps > 0)) return bad(absl::StrCat("eps must be > 0, got ", a.eps));
    if (!(a.weight_decay >= 0))
      return bad(absl::StrCat("weight_decay must be >= 0, got ", a.weight_decay));
  } else {
    const SgdHyper& s = h.sgd;
    if (!(s.lr >= 0)) return bad(absl::StrCat("lr must be >= 0, got ", s.lr));
    if (!(s.momentum >= 0)) return bad(absl::StrCat("momentum must be >= 0, got ", s.momentum));
    if (!(s.weight_decay >= 0))
      return bad(absl::StrCat("weight_decay must be >= 0, got ", s.weight_decay));
    if (s.nesterov && s.momentum == 0) return bad("nesterov needs momentum > 0");
  }
  return absl::OkStatus();
}

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
  if (reducer == nullptr || gatherer == nullptr) {
    return absl::InvalidArgumentError("optimizer: needs a reducer and a gatherer");
  }
  if (reducer->mode() == ReduceMode::kAllReduce) {
    return absl::InvalidArgumentError(
        "optimizer: the reducer is in all-reduce mode; the sharded optimizer needs reduce-scatter "
        "or hybrid mode (each rank steps only its shard)");
  }
  if (gatherer->plan().Fingerprint() != reducer->plan().Fingerprint()) {
    return absl::FailedPreconditionError(
        "optimizer: the gatherer was built for another bucket plan than the reducer's (rebuilt "
        "buckets? create the gatherer from reducer->plan() after RebuildBucketsIfPending)");
  }
  Group& shard = *reducer->groups().shard;
  if (&gatherer->group() == reducer->groups().shard ||
      &gatherer->group() == reducer->groups().replica) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: the gatherer uses the reducer's group '", gatherer->group().name(),
                     "'; its all-gathers would interleave with the reductions: give it a Split of "
                     "the shard group"));
  }
  if (gatherer->group().size() != shard.size() || gatherer->group().rank() != shard.rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: gatherer group '", gatherer->group().name(), "' (rank ",
                     gatherer->group().rank(), " of ", gatherer->group().size(),
                     ") does not match shard group '", shard.name(), "' (rank ", shard.rank(),
                     " of ", shard.size(), "): split the shard group with key = rank"));
  }
  if (config.groups.empty()) return absl::InvalidArgumentError("optimizer: no parameter group");
  for (size_t g = 0; g < config.groups.size(); ++g) {
    RETURN_IF_ERROR(CheckHyper(config.groups[g], config.kind, static_cast<int>(g)));
  }
  const BucketPlan& plan = reducer->plan();
  for (const auto& [id, g] : config.group_of) {
    absl::StatusOr<int> i = plan.IndexOf(id);
    if (!i.ok())
      return absl::NotFoundError(
          absl::StrCat("optimizer: group_of names unknown parameter id ", id));
    if (g < 0 || g >= static_cast<int>(config.groups.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: parameter ", plan.params()[*i].Label(), " is assigned to group ",
                       g, "; there are ", config.groups.size()));
    }
  }
  if (config.threads < 1) return absl::InvalidArgumentError("optimizer: threads must be >= 1");
  const sched::Bucket* first = plan.buckets().empty() ? nullptr : &plan.buckets()[0];
  if (first != nullptr && first->device.type != DeviceType::kCpu) {
    const std::string where = absl::StrCat("the parameters are on ", first->device.ToString());
    if (config.device_kernels == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: ", where,
                       ": OptimizerConfig::device_kernels is required (optim::CudaStepKernels())"));
    }
    if (shard.buffer_ops().synchronous() || !shard.buffer_ops().stream()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer: ", where, " but shard group '",
                                                     shard.name(),
                                                     "' has no device stream for the step"));
    }
  }
  if (config.track_grad_norm && first != nullptr && first->device.type != DeviceType::kCpu) {
    return absl::UnimplementedError(
        "optimizer: track_grad_norm is implemented for host parameters only (on a device, "
        "max_grad_norm > 0 reports the norm, at the cost of stepping after the last reduction)");
  }
  if (!(config.max_grad_norm >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: max_grad_norm must be >= 0, got ", config.max_grad_norm));
  }
  auto opt = std::unique_ptr<ShardedOptimizer>(new ShardedOptimizer(reducer, gatherer, config));
  RETURN_IF_ERROR(opt->Init());
  return opt;
}

absl::Status ShardedOptimizer::Init() {
  const BucketPlan& plan = reducer_->plan();
  Group& shard = *reducer_->groups().shard;
  plan_generation_ = reducer_->plan_generation();
  const size_t r = static_cast<size_t>(shard.rank());
  BufferOps& mem = shard.buffer_ops();
  on_device_ = !plan.buckets().empty() && plan.buckets()[0].device.type != DeviceType::kCpu;
  offload_ = on_device_ && config_.offload;
  BufferOps& state_mem = offload_ ? HostBufferOps() : mem;  // where the f32 state lives
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bk = plan.buckets()[b];
    auto s = std::make_unique<BucketState>();
    s->label = absl::StrCat("bucket ", b);
    s->n = bk.shard_count;
    ASSIGN_OR_RETURN(s->master,
                     ZeroedFloats(config_.memory, state_mem, s->n,
                                  absl::StrCat("optimizer master weights of ", s->label)));
    ASSIGN_OR_RETURN(s->m, ZeroedFloats(config_.memory, state_mem, s->n,
                                        absl::StrCat("optimizer state of ", s->label)));
    if (config_.kind == OptimizerKind::kAdamW) {
      ASSIGN_OR_RETURN(s->v, ZeroedFloats(config_.memory, state_mem, s->n,
                                          absl::StrCat("optimizer state of ", s->label)));
    }
    if (offload_) {
      const size_t bytes = std::max<size_t>(1, s->n * DTypeSize(bk.dtype));
      ASSIGN_OR_RETURN(
          s->grad_host,
          sched::CountedAllocate(config_.memory, HostBufferOps(), bytes, sched::MemoryUse::kStaging,
                                 absl::StrCat("offload gradient staging of ", s->label)));
      ASSIGN_OR_RETURN(
          s->param_host,
          sched::CountedAllocate(config_.memory, HostBufferOps(), bytes, sched::MemoryUse::kStaging,
                                 absl::StrCat("offload parameter staging of ", s->label)));
    }
    const size_t start = r * bk.shard_count, end = start + bk.shard_count;
    for (int pi : bk.params) {
      const size_t off = plan.slot(pi).offset, lo = std::max(off, start),
                   hi = std::min(off + plan.params()[pi].count, end);
      if (lo >= hi) continue;
      auto it = config_.group_of.find(plan.params()[pi].id);
      const int g = it == config_.group_of.end() ? 0 : it->second;
      if (!s->segments.empty() && s->segments.back().hi == lo - start &&
          s->segments.back().group == g) {
        s->segments.back().hi = hi - start;
      } else {
        s->segments.push_back(Segment{lo - start, hi - start, g});
      }
    }
    buckets_.push_back(std::move(s));
  }
  stats_.reset(new double[2]());
  if (on_device_ && (config_.max_grad_norm > 0 || config_.skip_nonfinite)) {
    size_t blocks = 0;
    for (auto& s : buckets_) {
      s->norm_offset = blocks;
      for (const Segment& seg : s->segments) blocks += NormBlocks(seg.hi - seg.lo);
    }
    norm_host_.assign(blocks, 0.0);
    ASSIGN_OR_RETURN(
        norm_dev_,
        sched::CountedAllocate(config_.memory, mem, std::max<size_t>(1, blocks) * sizeof(double),
                               sched::MemoryUse::kStaging, "gradient norm block sums"));
  }
  if (on_device_) {
    // Load's agreement all-reduces use it even without clipping.
    ASSIGN_OR_RETURN(stats_dev_, sched::CountedAllocate(config_.memory, mem, 2 * sizeof(double),
                                                        sched::MemoryUse::kStaging,
                                                        "optimizer statistics all-reduce"));
  }
  ASSIGN_OR_RETURN(stats_group_,
                   shard.Split(0, shard.rank(), absl::StrCat(shard.name(), "/optim")));
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
  RETURN_IF_ERROR(WaitRoundIdle("BeginBackward"));
  if (reducer_->plan_generation() != plan_generation_) {
    return absl::FailedPreconditionError(
        "optimizer: the reducer rebuilt its buckets after the optimizer was created; create the "
        "gatherer and optimizer again from the new plan");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_backward_)
      return absl::FailedPreconditionError(
          "optimizer: BeginBackward while a backward is in progress");
    if (stepable_) {
      return absl::FailedPreconditionError(
          "optimizer: the last synced backward was not stepped (overlap is off: call Step() "
          "before the next backward, or its gradients would be mixed into this one)");
    }
  }
  RETURN_IF_ERROR(reducer_->BeginBackward(mode));
  uint64_t round;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_backward_ = true;
    sync_ = mode;
    if (mode != SyncMode::kSync) return absl::OkStatus();
    round = ++round_;
    for (auto& s : buckets_) {
      s->reduced = false;
      s->reduce_status = absl::OkStatus();
    }
    if (config_.overlap) ArmLocked();
  }
  // Each bucket's final reduction reports here (one small allocation per bucket: the guard).
  for (size_t b = 0; b < buckets_.size(); ++b) {
    reducer_->BucketWork(static_cast<int>(b))
        ->OnComplete([guard = guard_, b, round](const absl::Status& st) {
          std::lock_guard<std::mutex> lock(guard->mu);
          if (guard->self != nullptr) guard->self->OnReduced(static_cast<int>(b), round, st);
        });
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void ShardedOptimizer::OnReduced(int b, uint64_t round, const absl::Status& st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A late completion of an earlier backward, or of a bucket FinishBackward already failed:
    // the first verdict stands.
    if (round != round_ || buckets_[b]->reduced) return;
    buckets_[b]->reduced = true;
    buckets_[b]->reduce_status = st;
  }
  cv_.notify_all();
}

void ShardedOptimizer::ArmLocked() {
  for (auto& s : buckets_) {
    s->published = false;
    s->publish_status = absl::OkStatus();
  }
  round_hyper_ = groups_;
  round_deadline_ = absl::Now() + config_.timeout;
  round_armed_ = true;
}

absl::Status ShardedOptimizer::FinishBackward() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!in_backward_)
      return absl::FailedPreconditionError("optimizer: FinishBackward without BeginBackward");
  }
  absl::Status s = reducer_->FinishBackward();
  std::lock_guard<std::mutex> lock(mu_);
  in_backward_ = false;
  if (sync_ != SyncMode::kSync) return s;
  if (!config_.overlap) {
    stepable_ = true;
  } else if (!s.ok()) {
    // Buckets that will never report (a parameter was never marked, a launch failed): end the
    // step there instead of letting the stepper wait for its deadline.
    for (auto& b : buckets_) {
      if (!b->reduced) {
        b->reduced = true;
        b->reduce_status = s;
      }
    }
    cv_.notify_all();
  }
  return s;
}

absl::Status ShardedOptimizer::Step() {
  if (config_.overlap) {
    return absl::FailedPreconditionError(
        "optimizer: Step() with overlap on (steps run as reductions complete)");
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stepable_) {
      return absl::FailedPreconditionError(
          "optimizer: Step() without gradients to step: run BeginBackward(kSync) ... "
          "FinishBackward() first (each synced backward is stepped once)");
    }
    stepable_ = false;
    for (size_t b = 0; b < buckets_.size(); ++b) {
      BucketState& s = *buckets_[b];
      const WorkPtr& w = reducer_->BucketWork(static_cast<int>(b));
      if (!s.reduced) {
        s.reduced = true;
        s.reduce_status = w->Done() ? w->status() : absl::FailedPreconditionError("not reduced");
      }
    }
    ArmLocked();
  }
  RunRound();
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(report_.error);
  for (const auto& s : buckets_) RETURN_IF_ERROR(s->publish_status);
  return absl::OkStatus();
}

// ---- the step ---------------------------------------------------------------------------

void ShardedOptimizer::StepperLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || (round_armed_ && !round_running_); });
      if (stop_) return;
      round_running_ = true;
    }
    RunRound();
  }
}

void ShardedOptimizer::RunRound() {
  const bool global = config_.max_grad_norm > 0 || config_.skip_nonfinite;
  const bool tracked = !global && config_.track_grad_norm;
  absl::Time deadline;
  {
    std::lock_guard<std::mutex> lock(mu_);
    deadline = round_deadline_;
    round_running_ = true;
    round_report_ = StepReport{};
    defer_completion_ = tracked;
  }
  double sumsq = 0;
  int failed_at = -1;
  absl::Status failure;
  for (int b = 0; b < static_cast<int>(buckets_.size()) && failed_at < 0; ++b) {
    BucketState& s = *buckets_[b];
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, absl::ToChronoTime(deadline), [&] { return stop_ || s.reduced; });
      if (stop_) {
        lock.unlock();  // Cancel takes mu_ itself
        return Cancel();
      }
      if (!s.reduced) {
        failure = absl::DeadlineExceededError(absl::StrCat("its reduction did not complete within ",
                                                           absl::FormatDuration(config_.timeout)));
      } else {
        failure = s.reduce_status;
      }
    }
    if (failure.ok() && global && on_device_) failure = QueueDeviceNorm(b);
    if (!failure.ok()) {
      failed_at = b;
    } else if (global) {
      if (!on_device_) sumsq += BucketSquaredNorm(b);
    } else {
      if (tracked) sumsq += BucketSquaredNorm(b);  // before the step zeroes the bucket
      Publish(b, true, StepBucket(b, 1.0));
    }
  }
  if (!global) {
    if (failed_at >= 0) DropFrom(failed_at, failure);
    if (tracked) FinishTrackedRound(sumsq, failed_at >= 0, deadline);
    return;
  }
  if (on_device_ && failed_at < 0) {
    // The one host wait of a clipped / checked device step: every block sum comes back. (Not
    // after a failure: a reduction that missed its deadline may still hold the stream.)
    absl::Status synced =
        ops().Copy(norm_host_.data(), norm_dev_.get(), norm_host_.size() * sizeof(double));
    if (synced.ok()) synced = ops().Synchronize(deadline);
    if (!synced.ok() && failed_at < 0) {
      failed_at = 0;
      failure = absl::Status(
          synced.code(), absl::StrCat("gradient norm on the stream of group '",
                                      reducer_->groups().shard->name(), "': ", synced.message()));
    }
    for (int b = 0; b < static_cast<int>(buckets_.size()) && failed_at < 0; ++b)
      sumsq += DeviceBucketSquaredNorm(b);
  }
  // One all-reduce of {sum of squares, ranks that failed}: every rank takes the same decision,
  // a rank whose reduction failed included (it must not skip a collective its peers issue).
  stats_[0] = failed_at < 0 ? sumsq : 0.0;
  stats_[1] = failed_at < 0 ? 0.0 : 1.0;
  const absl::Status st = SumStats(*stats_group_, deadline);
  if (!st.ok()) {
    return DropFrom(0,
                    absl::Status(st.code(), absl::StrCat("global gradient norm: ", st.message())));
  }
  if (failed_at >= 0) return DropFrom(0, failure);
  if (stats_[1] > 0) {
    return DropFrom(0, absl::AbortedError(absl::StrCat(
                           stats_[1], " other rank(s) of group '", stats_group_->name(),
                           "' could not reduce their gradients or take their norm")));
  }
  StepReport report;
  report.grad_norm = std::sqrt(stats_[0]);
  const bool finite = std::isfinite(report.grad_norm);
  report.skipped = config_.skip_nonfinite && !finite;
  if (config_.max_grad_norm > 0 && finite) {
    // As torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6), clamped to 1.
    report.clip_scale = std::min(1.0, config_.max_grad_norm / (report.grad_norm + 1e-6));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_report_ = report;
  }
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    Publish(b, true, report.skipped ? absl::OkStatus() : StepBucket(b, report.clip_scale));
  }
}

// ---- waits ------------------------------------------------------------------------------

absl::Status ShardedOptimizer::WaitBetweenSteps(const char* caller) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_backward_ || stepable_ || sync_ != SyncMode::kSync) {
      return absl::FailedPreconditionError(
          absl::StrCat("optimizer ", caller,
                       ": only between steps (not inside a backward, an accumulation "
                       "window, or before Step() of a finished backward)"));
    }
  }
  return WaitRoundIdle(caller);
}

absl::Status ShardedOptimizer::WaitRoundIdle(const char* caller) {
  std::unique_lock<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + config_.timeout;
  if (!cv_.wait_until(lock, absl::ToChronoTime(deadline), [this] { return !round_armed_; })) {
    return absl::DeadlineExceededError(absl::StrCat("optimizer ", caller,
                                                    ": the previous step did not finish within ",
                                                    absl::FormatDuration(config_.timeout)));
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::WaitStepped(const char* caller, int b) {
  if (b < 0 || b >= static_cast<int>(buckets_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("optimizer ", caller, ": no bucket ", b, " (", buckets_.size(), " buckets)"));
  }
  BucketState& s = *buckets_[b];
  std::unique_lock<std::mutex> lock(mu_);
  if (in_backward_ && !s.published) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer ", caller, "(", b, ") during a synced backward: ", s.label,
                     " is stepped once its gradients are reduced (wait after FinishBackward)"));
  }
  const absl::Time deadline = absl::Now() + config_.timeout;
  if (!cv_.wait_until(lock, absl::ToChronoTime(deadline), [&] { return s.published; })) {
    return absl::DeadlineExceededError(absl::StrCat("optimizer ", caller, ": the step of ", s.label,
                                                    " did not finish within ",
                                                    absl::FormatDuration(config_.timeout)));
  }
  return s.publish_status;
}

absl::Status ShardedOptimizer::WaitShard(int b, DeviceEvent* ready) {
  RETURN_IF_ERROR(WaitStepped("WaitShard", b));
  BucketState& s = *buckets_[b];
  s.dirty = false;  // the gather about to start reads the shard as it is now
  if (ready != nullptr) {
    // The step's completion on the shard group's stream (device); its Work keeps the event
    // valid until the next step of b, which cannot start before this gather was issued.
    *ready = on_device_ && s.step_work != nullptr ? s.step_work->device_event() : DeviceEvent{};
  }
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::WaitParams(int b) {
  RETURN_IF_ERROR(WaitStepped("WaitParams", b));
  BucketState& s = *buckets_[b];
  if (!config_.gather_after_step) return absl::OkStatus();  // the unit scheduler gathers
  if (s.dirty) {
    s.dirty = false;
    RETURN_IF_ERROR(Regather(b));
  }
  return gatherer_->WaitParams(b);
}

absl::Status ShardedOptimizer::WaitAllParams() {
  absl::Status first;
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    absl::Status s = WaitParams(b);
    if (first.ok()) first = s;
  }
  bool inside;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inside = in_backward_;
  }
  // Every bucket is published: the step completes at once, or after track_grad_norm's
  // all-reduce.
  if (first.ok() && !inside) first = WaitRoundIdle("WaitAllParams");
  return first;
}

// ---- parameters and hyper-parameters ----------------------------------------------------

absl::Status ShardedOptimizer::SetParam(ParamId id, const void* values) {
  const BucketPlan& plan = reducer_->plan();
  absl::StatusOr<int> i = plan.IndexOf(id);
  if (!i.ok())
    return absl::NotFoundError(absl::StrCat("optimizer SetParam: unknown parameter id ", id));
  const sched::ParamSpec& p = plan.params()[*i];
  if (values == nullptr && p.count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer SetParam(", p.Label(), "): null values"));
  }
  RETURN_IF_ERROR(WaitBetweenSteps("SetParam"));
  const int b = plan.slot(*i).bucket;
  BucketState& s = *buckets_[b];
  const size_t start = static_cast<size_t>(reducer_->groups().shard->rank()) * s.n;
  const size_t off = plan.slot(*i).offset;
  const size_t lo = std::max(off, start), hi = std::min(off + p.count, start + s.n);
  if (lo < hi) {
    const size_t es = DTypeSize(p.dtype);
    const char* src = static_cast<const char*>(values) + (lo - off) * es;
    char* out = static_cast<char*>(gatherer_->ShardView(b)->data) + (lo - start) * es;
    if (on_device_) {
      // Host values -> the model-dtype shard (device), widened from there into the master
      // weights (offload: on the host); the host waits, as `values` is the caller's.
      BufferOps& mem = ops();
      absl::Status st = mem.Copy(out, src, (hi - lo) * es);
      if (st.ok() && offload_) {
        CastScale(src, p.dtype, s.master.get() + (lo - start), DType::kF32, hi - lo, ScaleSpec{});
      } else if (st.ok()) {
        st = mem.CastScale(out, p.dtype, s.master.get() + (lo - start), DType::kF32, hi - lo,
                           ScaleSpec{});
      }
      if (st.ok()) st = mem.Synchronize(absl::Now() + config_.timeout);
      if (!st.ok()) {
        return absl::Status(st.code(),
                            absl::StrCat("optimizer SetParam(", p.Label(), "): ", st.message()));
      }
    } else {
      CastScale(src, p.dtype, s.master.get() + (lo - start), DType::kF32, hi - lo, ScaleSpec{});
      std::memcpy(out, src, (hi - lo) * es);
    }
  }
  s.dirty = true;
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::AdoptParam(ParamId id) {
  const BucketPlan& plan = reducer_->plan();
  absl::StatusOr<int> i = plan.IndexOf(id);
  if (!i.ok())
    return absl::NotFoundError(absl::StrCat("optimizer AdoptParam: unknown parameter id ", id));
  const sched::ParamSpec& p = plan.params()[*i];
  if (!config_.gather_after_step) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer AdoptParam(", p.Label(),
                     "): a fully sharded optimizer's parameters are "
                     "written through SetParam (e.g. a summon with writeback)"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_backward_) {
      return absl::FailedPreconditionError(
          absl::StrCat("optimizer AdoptParam(", p.Label(), "): inside a backward"));
    }
  }
  // Between steps, before Step() of a finished backward (overlap off: the step then starts
  // from the written values, as torch's would) or between the backwards of a window.
  RETURN_IF_ERROR(WaitRoundIdle("AdoptParam"));
  const int b = plan.slot(*i).bucket;
  RETURN_IF_ERROR(gatherer_->WaitParams(b));  // no gather writes the shard while we read it
  BucketState& s = *buckets_[b];
  const size_t start = static_cast<size_t>(reducer_->groups().shard->rank()) * s.n;
  const size_t off = plan.slot(*i).offset;
  const size_t lo = std::max(off, start), hi = std::min(off + p.count, start + s.n);
  if (lo >= hi) return absl::OkStatus();  // none of it is this rank's
  const size_t es = DTypeSize(p.dtype);
  // ZeRO-2's shard is this rank's range of the gathered buffer: what the framework wrote.
  const char* written = static_cast<const char*>(gatherer_->ShardView(b)->data) + (lo - start) * es;
  float* master = s.master.get() + (lo - start);
  if (!on_device_) {
    CastScale(written, p.dtype, master, DType::kF32, hi - lo, ScaleSpec{});
    return absl::OkStatus();
  }
  BufferOps& mem = ops();
  absl::Status st;
  if (offload_) {
    // Master weights in host memory: the written shard comes down through the staging buffer.
    char* staging = static_cast<char*>(s.param_host.get()) + (lo - start) * es;
    st = mem.Copy(staging, written, (hi - lo) * es);
    if (st.ok()) st = mem.Synchronize(absl::Now() + config_.timeout);
    if (st.ok()) CastScale(staging, p.dtype, master, DType::kF32, hi - lo, ScaleSpec{});
  } else {
    st = mem.CastScale(written, p.dtype, master, DType::kF32, hi - lo, ScaleSpec{});
    if (st.ok()) st = mem.Synchronize(absl::Now() + config_.timeout);
  }
  if (!st.ok())
    return absl::Status(st.code(),
                        absl::StrCat("optimizer AdoptParam(", p.Label(), "): ", st.message()));
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::SetHyper(int group, const GroupHyper& h) {
  if (group < 0 || group >= static_cast<int>(groups_.size())) {
    return absl::OutOfRangeError(absl::StrCat("optimizer SetHyper: no parameter group ", group));
  }
  RETURN_IF_ERROR(CheckHyper(h, config_.kind, group));
  std::lock_guard<std::mutex> lock(mu_);
  groups_[group] = h;  // the armed step keeps its snapshot
  return absl::OkStatus();
}

int64_t ShardedOptimizer::bucket_steps(int b) const {
  std::lock_guard<std::mutex> lock(mu_);
  return round_armed_ ? -1 : buckets_.at(b)->steps;
}

StepReport ShardedOptimizer::last_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return report_;
}

}  // namespace braid::optim
