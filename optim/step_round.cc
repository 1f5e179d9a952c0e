// ShardedOptimizer's round: one armed step, run by the stepper thread (overlap) or by Step().
// Each bucket in bucket order: wait for its reduction, step its shard (host_step.h,
// device_step.h, offload_step.h), then Publish (zero its gradients, start its all-gather, wake
// its waiters). With clipping or skip_nonfinite every bucket's norm is taken first and the
// ranks agree on the decision (norm_agreement.h) before any step. A failed reduction drops the
// step from that bucket on, on every rank.
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "optim/device_step.h"
#include "optim/global_norm.h"
#include "optim/host_step.h"
#include "optim/offload_step.h"
#include "optim/sharded_optimizer.h"

namespace braid::optim {

void ShardedOptimizer::OnReduced(int b, uint64_t round, const absl::Status& st) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A late completion of an earlier backward, or of a bucket FinishBackward already failed:
    // the first verdict stands.
    if (round != round_ || rounds_[b].reduced) return;
    rounds_[b].reduced = true;
    rounds_[b].reduce_status = st;
  }
  cv_.notify_all();
}

void ShardedOptimizer::ArmLocked() {
  for (BucketRound& r : rounds_) {
    r.published = false;
    r.publish_status = absl::OkStatus();
  }
  round_hyper_ = groups_;
  round_deadline_ = absl::Now() + config_.timeout;
}

void ShardedOptimizer::StepperLoop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || StepWaitingToRun(phase_); });
      if (stop_) return;
      phase_ = AfterRun(phase_);
    }
    RunRound();
  }
}

void ShardedOptimizer::RunRound() {
  const bool global = config_.max_grad_norm > 0 || config_.skip_nonfinite;
  absl::Time deadline;
  {
    std::lock_guard<std::mutex> lock(mu_);
    deadline = round_deadline_;
    phase_ = AfterRun(phase_);
    round_report_ = StepReport{};
  }
  const auto dtype = [this](int b) { return reducer_->plan().buckets()[b].dtype; };
  const auto grad = [this](int b) { return static_cast<const char*>(reducer_->ShardView(b).data); };
  double sumsq = 0;
  int failed_at = -1;
  absl::Status failure = WaitUsedMap(deadline);
  if (!failure.ok()) failed_at = 0;  // every rank still takes part in the norm's all-reduce
  for (int b = 0; b < static_cast<int>(rounds_.size()) && failed_at < 0; ++b) {
    BucketRound& r = rounds_[b];
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, absl::ToChronoTime(deadline), [&] { return stop_ || r.reduced; });
      if (stop_) {
        lock.unlock();  // Cancel takes mu_ itself
        return Cancel();
      }
      if (!r.reduced) {
        failure = absl::DeadlineExceededError(absl::StrCat("its reduction did not complete within ",
                                                           absl::FormatDuration(config_.timeout)));
      } else {
        failure = r.reduce_status;
      }
    }
    if (failure.ok() && global && on_device_) {
      failure = agreement_->QueueDeviceNorm(*config_.device_kernels, shards_[b], dtype(b), grad(b),
                                            ops(), reducer_->BucketWork(b)->device_event(),
                                            reducer_->groups().shard->name());
    }
    if (!failure.ok()) {
      failed_at = b;
    } else if (global) {
      if (!on_device_) sumsq += HostSquaredNorm(*pool_, shards_[b], dtype(b), grad(b));
    } else {
      // Before the step zeroes the bucket.
      if (tracked_norm_) sumsq += HostSquaredNorm(*pool_, shards_[b], dtype(b), grad(b));
      Publish(b, true, StepBucket(b, 1.0));
    }
  }
  if (!global) {
    if (failed_at >= 0) DropFrom(failed_at, failure);
    if (tracked_norm_) FinishTrackedRound(sumsq, failed_at >= 0, deadline);
    return;
  }
  if (on_device_ && failed_at < 0) {
    // The one host wait of a clipped / checked device step: every block sum comes back. (Not
    // after a failure: a reduction that missed its deadline may still hold the stream.)
    const absl::Status synced = agreement_->FetchDeviceNorms(ops(), deadline);
    if (!synced.ok()) {
      failed_at = 0;
      failure = absl::Status(
          synced.code(), absl::StrCat("gradient norm on the stream of group '",
                                      reducer_->groups().shard->name(), "': ", synced.message()));
    }
    for (int b = 0; b < static_cast<int>(shards_.size()) && failed_at < 0; ++b)
      sumsq += agreement_->DeviceSquaredNorm(shards_[b]);
  }
  // One all-reduce of {sum of squares, ranks that failed}: every rank takes the same decision,
  // a rank whose reduction failed included (it must not skip a collective its peers issue).
  double total = failed_at < 0 ? sumsq : 0.0, others_failed = failed_at < 0 ? 0.0 : 1.0;
  const absl::Status st = SumNorm(&total, &others_failed, deadline);
  if (!st.ok()) {
    return DropFrom(0,
                    absl::Status(st.code(), absl::StrCat("global gradient norm: ", st.message())));
  }
  if (failed_at >= 0) return DropFrom(0, failure);
  if (others_failed > 0) {
    return DropFrom(0, absl::AbortedError(
                           absl::StrCat(others_failed, " other rank(s) of group '", NormGroupName(),
                                        "' could not reduce their gradients or take their norm")));
  }
  StepReport report;
  report.grad_norm = std::sqrt(total);
  const bool finite = std::isfinite(report.grad_norm);
  report.skipped = config_.skip_nonfinite && !finite;
  if (config_.max_grad_norm > 0 && finite) {
    report.clip_scale = NormAgreement::ClipScale(config_.max_grad_norm, report.grad_norm);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_report_ = report;
  }
  for (int b = 0; b < static_cast<int>(shards_.size()); ++b) {
    Publish(b, true, report.skipped ? absl::OkStatus() : StepBucket(b, report.clip_scale));
  }
}

absl::Status ShardedOptimizer::StepBucket(int b, double grad_scale) {
  OptimizerShard& s = shards_[b];
  // Peers may still be reading this rank's shard for b's previous all-gather (a framework that
  // did not WaitParams(b) before its next backward): the step writes the shard only after that
  // gather completed here (local: its Work completes once every rank copied; mpi: once MPI
  // released the send buffer) or, on device, after its event on the stream.
  if (WorkPtr g = gatherer_->GatherWork(b); g != nullptr) {
    absl::Status st = on_device_ ? ops().WaitFor(g->device_event())
                                 : (g->Done() ? absl::OkStatus() : g->Wait(config_.timeout));
    if (!st.ok()) {
      return WithContext(
          st, absl::StrCat("optimizer step of ", s.label, ": waiting for its previous all-gather"));
    }
  }
  ++s.steps;
  const sched::Bucket& bk = reducer_->plan().buckets()[b];
  const ShardStepArgs args{config_.kind,
                           &round_hyper_,
                           bk.dtype,
                           static_cast<const char*>(reducer_->ShardView(b).data),
                           static_cast<char*>(gatherer_->ShardView(b)->data),
                           grad_scale,
                           &s.skips.Plan(s.segments, s.steps, bk.params, round_used_)};
  if (offload_) {
    return OffloadStep(*pool_, s, args, ops(), reducer_->BucketWork(b)->device_event(),
                       config_.timeout, reducer_->groups().shard->name());
  }
  if (on_device_) {
    return QueueDeviceStep(*config_.device_kernels, s, args, ops(),
                           reducer_->BucketWork(b)->device_event(),
                           reducer_->groups().shard->name());
  }
  HostStep(*pool_, s, args);
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::WaitUsedMap(absl::Time deadline) {
  round_used_ = nullptr;
  const sched::UsedMap& used = reducer_->used_map();
  if (!used.agrees()) return absl::OkStatus();
  // Issued first in the backward (declared) or at its end: parameters no rank used are not
  // stepped (torch's optimizer skips a None grad).
  WorkPtr w = used.work();
  if (w == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(WithContext(w->WaitUntil(deadline), "the step's used-parameter agreement"));
  round_used_ = used.map();
  return absl::OkStatus();
}

absl::Status ShardedOptimizer::Regather(int b, DeviceEvent ready) {
  // A gather of b that nobody waited for still counts as in flight for the gatherer.
  WorkPtr w = gatherer_->GatherWork(b);
  if (w != nullptr && !w->Done()) RETURN_IF_ERROR(gatherer_->WaitParams(b));
  if (w != nullptr && w->Done() && !gatherer_->IsGathered(b)) {
    RETURN_IF_ERROR(gatherer_->WaitParams(b));  // completed unobserved: observe it (starts nothing)
  }
  RETURN_IF_ERROR(gatherer_->Prefetch(b, ready));
  rounds_[b].dirty = false;  // the shard's values are on their way to every rank
  return absl::OkStatus();
}

void ShardedOptimizer::Publish(int b, bool zero_grads, absl::Status stepped) {
  DeviceEvent ready;
  BucketRound& r = rounds_[b];
  if (on_device_ && stepped.ok()) {
    // The gather (another group's stream) waits for the step through this event, recorded on
    // the shard group's stream after the step's kernels; the Work keeps it valid.
    r.step_work = Work::Create(
        WorkInfo{reducer_->groups().shard->name(), "optimizer step", 0, shards_[b].label});
    stepped = ops().CompleteAfter(r.step_work, absl::Now() + config_.timeout);
    if (stepped.ok()) ready = r.step_work->device_event();
  }
  // Consumed: the next window starts from zero (device: queued after the step, which reads it).
  // A failed zeroing is reported after the gather is issued (every rank issues it).
  const absl::Status zeroed = zero_grads ? reducer_->ZeroBucket(b) : absl::OkStatus();
  // Fully sharded: the shard is the result; the unit scheduler gathers it before its next use
  // (WaitShard hands it the step's event).
  absl::Status status = config_.fully_sharded ? absl::OkStatus() : Regather(b, ready);
  if (!stepped.ok()) status = stepped;
  if (status.ok()) status = zeroed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.published = true;
    r.publish_status = std::move(status);
    if (b + 1 == static_cast<int>(rounds_.size()) && !tracked_norm_) {
      CompleteRoundLocked();  // the step is complete: one critical section
    }
  }
  cv_.notify_all();
}

void ShardedOptimizer::CompleteRoundLocked() {
  const int64_t rounds = report_.rounds + 1;
  report_ = round_report_;
  report_.rounds = rounds;
  phase_ = AfterComplete(phase_);
}

void ShardedOptimizer::FinishTrackedRound(double sumsq, bool failed, absl::Time deadline) {
  // Every rank takes part, a rank that dropped buckets too (its peers issue the all-reduce).
  double total = failed ? 0.0 : sumsq, failed_ranks = failed ? 1.0 : 0.0;
  const absl::Status st = SumNorm(&total, &failed_ranks, deadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.ok() && round_report_.error.ok()) {
      round_report_.error = absl::Status(
          st.code(), absl::StrCat("the step was taken, but its gradient norm (track_grad_norm) "
                                  "could not be summed across the shard group: ",
                                  st.message()));
    } else if (st.ok() && failed_ranks == 0) {
      round_report_.grad_norm = std::sqrt(total);
    }
    CompleteRoundLocked();
  }
  cv_.notify_all();
}

absl::Status ShardedOptimizer::SumNorm(double* sumsq, double* failed, absl::Time deadline) {
  if (config_.global_norm == nullptr) {
    return agreement_->Sum2(agreement_->group(), sumsq, failed, deadline);
  }
  return config_.global_norm->Combine(config_.norm_member, sumsq, failed, deadline);
}

const std::string& ShardedOptimizer::NormGroupName() const {
  return config_.global_norm != nullptr ? config_.global_norm->name() : agreement_->group().name();
}

void ShardedOptimizer::DropFrom(int b, const absl::Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_report_ = StepReport{};
    // b is past the end when there is no bucket at all (a reducer without parameters whose
    // global-norm all-reduce failed): nothing to name or drop.
    round_report_.error =
        b < static_cast<int>(shards_.size())
            ? absl::Status(s.code(),
                           absl::StrCat("optimizer step not taken from ", shards_[b].label, " on (",
                                        shards_[b].label, ": ", s.message(),
                                        "); those buckets' gradients were dropped, "
                                        "their parameters are unchanged"))
            : absl::Status(s.code(), absl::StrCat("optimizer step not taken (", s.message(),
                                                  "); the optimizer holds no bucket"));
  }
  for (int k = b; k < static_cast<int>(rounds_.size()); ++k) {
    // Gathered again, unchanged: every rank issues the same gathers whatever failed where. A
    // reduction still in flight (deadline) keeps its buffer: not ours to zero then.
    Publish(k, /*zero_grads=*/reducer_->BucketWork(k)->Done());
  }
}

void ShardedOptimizer::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t b = 0; b < rounds_.size(); ++b) {
      BucketRound& r = rounds_[b];
      if (r.published) continue;
      r.published = true;
      r.publish_status = absl::CancelledError(
          absl::StrCat("optimizer destroyed before the step of ", shards_[b].label));
    }
    phase_ = AfterComplete(phase_);
  }
  cv_.notify_all();
}

}  // namespace braid::optim
