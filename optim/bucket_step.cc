// ShardedOptimizer's per-bucket step: the global statistics (norm, non-finite count) summed
// across groups, the host and device steps of one bucket, the regather of its updated shard,
// and publishing (or dropping) each bucket's outcome to the waiters.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/check.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"
#include "optim/adamw_kernel.h"
#include "optim/norm_math.h"
#include "optim/optimizer_bucket.h"
#include "optim/sharded_optimizer.h"

namespace braid::optim {

using sched::Bucket;
using sched::BucketPlan;
using sched::ReduceMode;
using sched::SyncMode;

absl::Status ShardedOptimizer::SumStats(Group& g, absl::Time deadline) {
  if (!on_device_) {
    absl::StatusOr<WorkPtr> w = g.AllReduce(stats_.get(), stats_.get(), 2, DType::kF64,
                                            ReduceOp::Sum(), CollectiveOptions{});
    return w.ok() ? (*w)->WaitUntil(deadline) : w.status();
  }
  // Device collectives take device memory: in through g's stream, summed there, and back.
  BufferOps& mem = g.buffer_ops();
  auto* dev = reinterpret_cast<double*>(stats_dev_.get());
  const size_t bytes = 2 * sizeof(double);
  RETURN_IF_ERROR(mem.Copy(dev, stats_.get(), bytes));
  ASSIGN_OR_RETURN(WorkPtr w,
                   g.AllReduce(dev, dev, 2, DType::kF64, ReduceOp::Sum(), CollectiveOptions{}));
  RETURN_IF_ERROR(w->WaitUntil(deadline));
  RETURN_IF_ERROR(mem.WaitFor(w->device_event()));
  RETURN_IF_ERROR(mem.Copy(stats_.get(), dev, bytes));
  return mem.Synchronize(deadline);
}

absl::Status ShardedOptimizer::QueueDeviceNorm(int b) {
  BucketState& s = *buckets_[b];
  const Bucket& bk = reducer_->plan().buckets()[b];
  const char* grad = static_cast<const char*>(reducer_->ShardView(b).data);
  auto* sums = reinterpret_cast<double*>(norm_dev_.get());
  BufferOps& mem = ops();
  absl::Status st = mem.WaitFor(reducer_->BucketWork(b)->device_event());
  size_t at = s.norm_offset;
  for (size_t k = 0; k < s.segments.size() && st.ok(); ++k) {
    const Segment& seg = s.segments[k];
    st = config_.device_kernels->NormBlockSums(grad + seg.lo * DTypeSize(bk.dtype), bk.dtype,
                                               seg.hi - seg.lo, sums + at, mem.stream());
    at += NormBlocks(seg.hi - seg.lo);
  }
  if (!st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("gradient norm of ", s.label, " on the stream of group '",
                                     reducer_->groups().shard->name(), "': ", st.message()));
  }
  return absl::OkStatus();
}

double ShardedOptimizer::DeviceBucketSquaredNorm(int b) const {
  const BucketState& s = *buckets_[b];
  double sum = 0;
  size_t at = s.norm_offset;
  for (const Segment& seg : s.segments) {
    const size_t blocks = NormBlocks(seg.hi - seg.lo);
    sum += NormSumBlocks(norm_host_.data() + at, blocks);  // SquaredNormF64 of the segment
    at += blocks;
  }
  return sum;
}

absl::Status ShardedOptimizer::StepBucket(int b, double grad_scale) {
  BucketState& s = *buckets_[b];
  const Bucket& bk = reducer_->plan().buckets()[b];
  const size_t es = DTypeSize(bk.dtype);
  const char* grad = static_cast<const char*>(reducer_->ShardView(b).data);
  char* out = static_cast<char*>(gatherer_->ShardView(b)->data);
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
  if (offload_) return OffloadStepBucket(b, grad_scale);
  if (on_device_) {
    // Queued on the shard group's stream after the reduction's last device operation (hybrid:
    // on the replica group's stream, so this wait is what orders the step after it).
    BufferOps& mem = ops();
    absl::Status st = mem.WaitFor(reducer_->BucketWork(b)->device_event());
    for (size_t k = 0; k < s.segments.size() && st.ok(); ++k) {
      const Segment& seg = s.segments[k];
      const GroupHyper& h = round_hyper_[seg.group];
      const size_t n = seg.hi - seg.lo;
      if (config_.kind == OptimizerKind::kAdamW) {
        st = config_.device_kernels->AdamW(StepScalars(h.adamw, s.steps, grad_scale),
                                           s.master.get() + seg.lo, s.m.get() + seg.lo,
                                           s.v.get() + seg.lo, grad + seg.lo * es, bk.dtype, n,
                                           out + seg.lo * es, bk.dtype, mem.stream());
      } else {
        st = config_.device_kernels->Sgd(
            SgdStepScalars(h.sgd, s.steps, grad_scale), s.master.get() + seg.lo,
            h.sgd.momentum != 0 ? s.m.get() + seg.lo : nullptr, grad + seg.lo * es, bk.dtype, n,
            out + seg.lo * es, bk.dtype, mem.stream());
      }
    }
    if (!st.ok()) {
      return absl::Status(st.code(),
                          absl::StrCat("optimizer step of ", s.label, " on the stream of group '",
                                       reducer_->groups().shard->name(), "': ", st.message()));
    }
    return absl::OkStatus();
  }
  HostStep(b, grad, out, grad_scale);
  return absl::OkStatus();
}

void ShardedOptimizer::HostStep(int b, const char* grad, char* out, double grad_scale) {
  BucketState& s = *buckets_[b];
  const Bucket& bk = reducer_->plan().buckets()[b];
  const size_t es = DTypeSize(bk.dtype);
  for (const Segment& seg : s.segments) {
    const GroupHyper& h = round_hyper_[seg.group];
    const size_t n = seg.hi - seg.lo;
    const char* g = grad + seg.lo * es;
    char* o = out + seg.lo * es;
    if (config_.kind == OptimizerKind::kAdamW) {
      AdamWParallel(*pool_, StepScalars(h.adamw, s.steps, grad_scale), s.master.get() + seg.lo,
                    s.m.get() + seg.lo, s.v.get() + seg.lo, g, bk.dtype, n, o, bk.dtype);
    } else {
      SgdParallel(*pool_, SgdStepScalars(h.sgd, s.steps, grad_scale), s.master.get() + seg.lo,
                  h.sgd.momentum != 0 ? s.m.get() + seg.lo : nullptr, g, bk.dtype, n, o, bk.dtype);
    }
  }
}

double ShardedOptimizer::BucketSquaredNorm(int b) {
  const BucketState& s = *buckets_[b];
  const Bucket& bk = reducer_->plan().buckets()[b];
  const char* grad = static_cast<const char*>(reducer_->ShardView(b).data);
  double sum = 0;
  for (const Segment& seg : s.segments) {
    sum += SquaredNormF64(*pool_, grad + seg.lo * DTypeSize(bk.dtype), bk.dtype, seg.hi - seg.lo);
  }
  return sum;
}

absl::Status ShardedOptimizer::Regather(int b, DeviceEvent ready) {
  // A gather of b that nobody waited for still counts as in flight for the gatherer.
  WorkPtr w = gatherer_->GatherWork(b);
  if (w != nullptr && !w->Done()) RETURN_IF_ERROR(gatherer_->WaitParams(b));
  if (w != nullptr && w->Done() && !gatherer_->IsGathered(b)) {
    RETURN_IF_ERROR(gatherer_->WaitParams(b));  // completed unobserved: observe it (starts nothing)
  }
  RETURN_IF_ERROR(gatherer_->Prefetch(b, ready));
  buckets_[b]->dirty = false;  // the shard's values are on their way to every rank
  return absl::OkStatus();
}

void ShardedOptimizer::Publish(int b, bool zero_grads, absl::Status stepped) {
  DeviceEvent ready;
  if (on_device_ && stepped.ok()) {
    // The gather (another group's stream) waits for the step through this event, recorded on
    // the shard group's stream after the step's kernels; the Work keeps it valid.
    BucketState& s = *buckets_[b];
    s.step_work =
        Work::Create(WorkInfo{reducer_->groups().shard->name(), "optimizer step", 0, s.label});
    stepped = ops().CompleteAfter(s.step_work, absl::Now() + config_.timeout);
    if (stepped.ok()) ready = s.step_work->device_event();
  }
  // Consumed: the next window starts from zero (device: queued after the step, which reads it).
  // A failed zeroing is reported after the gather is issued (every rank issues it).
  const absl::Status zeroed = zero_grads ? reducer_->ZeroBucket(b) : absl::OkStatus();
  // Fully sharded: the shard is the result; the unit scheduler gathers it before its next use
  // (WaitShard hands it the step's event).
  absl::Status status = config_.gather_after_step ? Regather(b, ready) : absl::OkStatus();
  if (!stepped.ok()) status = stepped;
  if (status.ok()) status = zeroed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    buckets_[b]->published = true;
    buckets_[b]->publish_status = std::move(status);
    if (b + 1 == static_cast<int>(buckets_.size()) && !defer_completion_) {
      CompleteRoundLocked();  // the step is complete: one critical section
    }
  }
  cv_.notify_all();
}

void ShardedOptimizer::CompleteRoundLocked() {
  const int64_t rounds = report_.rounds + 1;
  report_ = round_report_;
  report_.rounds = rounds;
  round_armed_ = round_running_ = false;
  defer_completion_ = false;
}

void ShardedOptimizer::FinishTrackedRound(double sumsq, bool failed, absl::Time deadline) {
  // Every rank takes part, a rank that dropped buckets too (its peers issue the all-reduce).
  stats_[0] = failed ? 0.0 : sumsq;
  stats_[1] = failed ? 1.0 : 0.0;
  const absl::Status st = SumStats(*stats_group_, deadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.ok() && round_report_.error.ok()) {
      round_report_.error = absl::Status(
          st.code(), absl::StrCat("the step was taken, but its gradient norm (track_grad_norm) "
                                  "could not be summed across the shard group: ",
                                  st.message()));
    } else if (st.ok() && stats_[1] == 0) {
      round_report_.grad_norm = std::sqrt(stats_[0]);
    }
    CompleteRoundLocked();
  }
  cv_.notify_all();
}

void ShardedOptimizer::DropFrom(int b, const absl::Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    round_report_ = StepReport{};
    // b is past the end when there is no bucket at all (a reducer without parameters whose
    // global-norm all-reduce failed): nothing to name or drop.
    round_report_.error =
        b < static_cast<int>(buckets_.size())
            ? absl::Status(s.code(),
                           absl::StrCat("optimizer step not taken from ", buckets_[b]->label,
                                        " on (", buckets_[b]->label, ": ", s.message(),
                                        "); those buckets' gradients were dropped, "
                                        "their parameters are unchanged"))
            : absl::Status(s.code(), absl::StrCat("optimizer step not taken (", s.message(),
                                                  "); the optimizer holds no bucket"));
  }
  for (int k = b; k < static_cast<int>(buckets_.size()); ++k) {
    // Gathered again, unchanged: every rank issues the same gathers whatever failed where. A
    // reduction still in flight (deadline) keeps its buffer: not ours to zero then.
    Publish(k, /*zero_grads=*/reducer_->BucketWork(k)->Done());
  }
}

void ShardedOptimizer::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& bs : buckets_) {
      if (bs->published) continue;
      bs->published = true;
      bs->publish_status =
          absl::CancelledError(absl::StrCat("optimizer destroyed before the step of ", bs->label));
    }
    round_armed_ = round_running_ = false;
  }
  cv_.notify_all();
}

}  // namespace braid::optim
