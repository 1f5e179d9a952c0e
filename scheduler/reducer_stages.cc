// GradientReducer's completion side (see gradient_reducer.h): what runs when a bucket's
// collective completes. OnStageDone queues the post-collective operations (f16 post-divide,
// the rounding of f32 staging to the gradient dtype, the copy-in path's unpack) and finishes
// the bucket, or hands a hybrid bucket's reduced shard to its replica all-reduce
// (LaunchReplicaStages, in bucket order); OnKeptStageDone is the shard_gradients path (the
// reduced shard copied or added into the kept shard, the storage given back); FinishBucket
// completes the bucket's Work, on device once the queued operations ran.
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/reducer_bucket_state.h"

namespace braid::sched {

void GradientReducer::OnStageDone(int b, int stage, const absl::Status& done) {
  const BucketState::Stage& rec = buckets_[b]->stage[stage];
  if (tl_ != nullptr) {
    const char* name = stage == 1                               ? "allreduce (replicas)"
                       : config_.mode == ReduceMode::kAllReduce ? "allreduce"
                                                                : "reduce_scatter";
    tl_->Complete(stage == 1 ? tl_replica_ : tl_first_, name, rec.start_ns, Timeline::NowNs(), b);
  }
  if (config_.keep_shards_only) {
    OnKeptStageDone(b, stage, done);
    return;
  }
  const Bucket& bk = plan_.buckets()[b];
  const bool whole = config_.mode == ReduceMode::kAllReduce;
  const DType t = CommDType(b);
  const bool last_stage = config_.mode != ReduceMode::kHybrid || stage == 1;
  const bool feeds_replicas = !last_stage && sync_ != SyncMode::kReduceScatterOnly;
  // Where this step's memory operations run: after the collective on its own group, except
  // those that feed the hybrid replica all-reduce, which run ahead of it on the replica group
  // (ordered after the reduce-scatter's completion event).
  BufferOps& ops = stage == 1 || feeds_replicas ? final_ops_ : ops_;
  absl::Status st = done;
  if (st.ok() && feeds_replicas) st = ops.WaitFor(rec.work->device_event());
  if (st.ok() && rec.post_divide > 1) {  // f16: the divide after the sum
    char* p = whole ? CommData(b) : CommShard(b);
    st = ops.CastScale(p, t, p, t, whole ? bk.count : bk.shard_count,
                       ScaleSpec{false, 1.0, rec.post_divide});
  }
  if (last_stage) {
    if (st.ok() && buckets_[b]->staging) {  // round once, to the gradient dtype
      st =
          ops.CastScale(whole ? CommData(b) : CommShard(b), t, whole ? BucketData(b) : ShardData(b),
                        bk.dtype, whole ? bk.count : bk.shard_count, ScaleSpec{});
    }
    if (st.ok() && !config_.gradient_as_bucket_view && whole) st = Unpack(b);
    FinishBucket(b, OpError(b, done, st), ops);
    return;
  }
  // Hybrid: the shard is reduced within its replica.
  if (st.ok() && sync_ == SyncMode::kReduceScatterOnly) {
    st = AccumulatePartial(b);  // and the microbatch's gradients are consumed: zero them
    if (st.ok()) st = ops.Zero(BucketData(b), plan_.buckets()[b].bytes());
    FinishBucket(b, OpError(b, done, st), ops);
    return;
  }
  if (st.ok()) st = AddPartialInto(b);
  st = OpError(b, done, st);
  if (!st.ok()) FinishBucket(b, st, ops);
  LaunchReplicaStages(b, st);
}

void GradientReducer::LaunchReplicaStages(int b, const absl::Status& st) {
  // All-reduce it across replicas, in bucket order (a failed bucket is skipped: its error
  // already ends this backward).
  int first, last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    buckets_[b]->first_done = true;
    buckets_[b]->failed = !st.ok();
    first = allreduce_cursor_;
    while (allreduce_cursor_ < static_cast<int>(buckets_.size()) &&
           buckets_[allreduce_cursor_]->first_done) {
      const int k = allreduce_cursor_++;
      if (!buckets_[k]->failed) LaunchStageLocked(k, 1);
    }
    last = allreduce_cursor_;
  }
  Watch(first, last, 1);
}

void GradientReducer::OnKeptStageDone(int b, int stage, const absl::Status& done) {
  BucketState& s = *buckets_[b];
  const Bucket& bk = plan_.buckets()[b];
  const BucketState::Stage& rec = s.stage[stage];
  const DType t = CommDType(b);
  const size_t n = bk.shard_count;
  absl::Status st = done;
  if (stage == 1) {  // the replica all-reduce ran in place on the kept (or f32) shard
    if (st.ok() && rec.post_divide > 1) {
      st = final_ops_.CastScale(CommKept(b), t, CommKept(b), t, n,
                                ScaleSpec{false, 1.0, rec.post_divide});
    }
    if (st.ok() && s.reduced)
      st = final_ops_.CastScale(s.reduced.get(), t, s.kept.get(), bk.dtype, n, ScaleSpec{});
    FinishBucket(b, OpError(b, done, st), final_ops_);
    return;
  }
  // The reduce-scatter: everything that reads the storage is queued on the shard stream.
  const bool hybrid = config_.mode == ReduceMode::kHybrid;
  if (st.ok() && rec.post_divide > 1) {
    st =
        ops_.CastScale(CommShard(b), t, CommShard(b), t, n, ScaleSpec{false, 1.0, rec.post_divide});
  }
  if (st.ok() && !hybrid) {
    st = s.staging ? ops_.CastScale(CommShard(b), t, s.kept.get(), bk.dtype, n, ScaleSpec{})
                   : ops_.Copy(s.kept.get(), CommShard(b), n * DTypeSize(t));
  } else if (st.ok()) {  // hybrid: into the partial sum, or copied (a copy keeps -0.0)
    st = s.has_partial ? ops_.Add(CommKept(b), CommShard(b), CommKept(b), n, t)
                       : ops_.Copy(CommKept(b), CommShard(b), n * DTypeSize(t));
    if (st.ok()) s.has_partial = sync_ == SyncMode::kReduceScatterOnly;
  }
  // Issued after every use of the storage on this stream; a failed bucket keeps it (the
  // collective may not have let go of it) until ZeroBucket / ZeroGrads.
  if (st.ok()) ReleaseStorage(b);
  if (!hybrid || sync_ == SyncMode::kReduceScatterOnly) {
    FinishBucket(b, OpError(b, done, st), ops_);
    return;
  }
  if (st.ok() && !ops_.synchronous()) {  // the replica stream waits for the copy into the shard
    s.handoff = works_.Create(
        WorkInfo{groups_.shard->name(), "shard handoff", static_cast<uint64_t>(b), s.label});
    st = ops_.CompleteAfter(s.handoff, absl::Now() + config_.timeout);
    if (st.ok()) st = final_ops_.WaitFor(s.handoff->device_event());
  }
  st = OpError(b, done, st);
  if (!st.ok()) FinishBucket(b, st, ops_);
  LaunchReplicaStages(b, st);
}

void GradientReducer::FinishBucket(int b, absl::Status s, BufferOps& ops) {
  WorkPtr w = buckets_[b]->work;  // keeps the Work alive while its callbacks run
  if (s.ok() && !ops.synchronous()) {
    // Device: the bucket's result is final once the operations queued after the collective
    // have run; the Work completes then (and exposes that point as its device event).
    s = ops.CompleteAfter(w, absl::Now() + config_.timeout);
    if (s.ok()) return;
    s = OpError(b, absl::OkStatus(), s);
  }
  if (!s.ok()) RecordError(s);
  w->Complete(std::move(s));
}

}  // namespace braid::sched
