// GradientReducer's bucket storage (declared in gradient_reducer.h): the pool behind
// keep_shards_only's full-size storage, reduce_scatter_only's partial sums, and zeroing.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/reducer_bucket_state.h"

namespace braid::sched {

namespace {
size_t PoolKey(size_t bytes) { return (bytes + kStorageAlign - 1) / kStorageAlign * kStorageAlign; }
}  // namespace

absl::StatusOr<OwnedBuffer> GradientReducer::PoolAcquire(size_t bytes, int b) {
  bytes = PoolKey(bytes);
  OwnedBuffer pooled = pool_->Take(bytes);
  if (pooled) return pooled;
  // None fits: the pool grows (never in steady state).
  ASSIGN_OR_RETURN(OwnedBuffer out,
                   CountedAllocate(config_.memory, ops_, bytes, MemoryUse::kGradBuckets,
                                   absl::StrCat(buckets_[b]->label, " (pooled gradient storage)")));
  pool_->Reserve(++pool_buffers_);  // giving it back never allocates
  return out;
}

void GradientReducer::PoolRelease(OwnedBuffer buffer, size_t bytes) {
  if (!buffer) return;
  pool_->Give(std::move(buffer), PoolKey(bytes));
}

absl::Status GradientReducer::AcquireStorage(int b) {
  BucketState& s = *buckets_[b];
  std::lock_guard<std::mutex> lock(s.storage_mu);
  if (s.data) return absl::OkStatus();
  const size_t bytes = plan_.buckets()[b].bytes();
  ASSIGN_OR_RETURN(OwnedBuffer data, PoolAcquire(bytes, b));
  // Zero-filled before any mark writes (issued under storage_mu: marks of this bucket on other
  // threads issue their copies after it).
  absl::Status st = ops_.Zero(data.get(), bytes);
  if (!st.ok()) {
    PoolRelease(std::move(data), bytes);
    return WithContext(st, absl::StrCat("zero-filling the storage of ", s.label));
  }
  s.data = std::move(data);
  return absl::OkStatus();
}

void GradientReducer::ReleaseStorage(int b) {
  BucketState& s = *buckets_[b];
  std::lock_guard<std::mutex> lock(s.storage_mu);
  const Bucket& bk = plan_.buckets()[b];
  PoolRelease(std::move(s.staging), bk.padded_count * DTypeSize(DType::kF32));
  PoolRelease(std::move(s.data), bk.bytes());
  s.staging.Reset();
  s.data.Reset();
}

absl::Status GradientReducer::OpError(int b, const absl::Status& collective,
                                      const absl::Status& st) const {
  if (st.ok() || !collective.ok()) return st;  // a collective's error names itself
  return absl::Status(st.code(), absl::StrCat(buckets_[b]->label, " on group '",
                                              groups_.shard->name(), "': ", st.message()));
}

absl::Status GradientReducer::AccumulatePartial(int b) {
  BucketState& s = *buckets_[b];
  const Bucket& bk = plan_.buckets()[b];
  const DType t = CommDType(b);
  const size_t bytes = bk.shard_count * DTypeSize(t);
  if (!s.partial) {
    ASSIGN_OR_RETURN(s.partial, CountedAllocate(config_.memory, ops_, bytes, MemoryUse::kGradShards,
                                                absl::StrCat(s.label, " (partial sum)")));
  }
  if (!s.has_partial) {
    RETURN_IF_ERROR(
        ops_.Copy(s.partial.get(), CommShard(b), bytes));  // a copy, not 0 + x: keeps -0.0
    s.has_partial = true;
    return absl::OkStatus();
  }
  return ops_.Add(s.partial.get(), CommShard(b), s.partial.get(), bk.shard_count, t);
}

absl::Status GradientReducer::AddPartialInto(int b) {
  BucketState& s = *buckets_[b];
  if (!s.has_partial) return absl::OkStatus();
  const Bucket& bk = plan_.buckets()[b];
  s.has_partial = false;
  return final_ops_.Add(s.partial.get(), CommShard(b), CommShard(b), bk.shard_count, CommDType(b));
}

absl::Status GradientReducer::ZeroGrads(DeviceEvent after) {
  RETURN_IF_ERROR(ops_.WaitFor(after));
  absl::Status first;
  for (size_t b = 0; b < buckets_.size(); ++b) first.Update(ZeroBucketQueued(static_cast<int>(b)));
  first.Update(SyncZeroing());
  return first;
}

absl::Status GradientReducer::ZeroBucket(int b) {
  absl::Status st = ZeroBucketQueued(b);
  st.Update(SyncZeroing());
  return st;
}

absl::StatusOr<WorkPtr> GradientReducer::ZeroGradsAsync(DeviceEvent after) {
  RETURN_IF_ERROR(ops_.WaitFor(after));
  for (size_t b = 0; b < buckets_.size(); ++b)
    RETURN_IF_ERROR(ZeroBucketQueued(static_cast<int>(b)));
  WorkPtr w = works_.Create(WorkInfo{groups_.shard->name(), "zero_grads", 0, "every bucket"});
  if (ops_.synchronous()) {  // host memory: the zeroes are there now
    w->Complete(absl::OkStatus());
    return w;
  }
  // The device event is recorded on the comm stream after the memsets: the framework's stream
  // waits on it (cudaStreamWaitEvent) before writing into the gradient views; the reducer's own
  // operations need nothing (same stream). The Work keeps the event valid while it is held.
  RETURN_IF_ERROR(ops_.CompleteAfter(w, absl::Now() + config_.timeout));
  return w;
}

absl::Status GradientReducer::ZeroBucketQueued(int b) {
  if (config_.gradient_as_bucket_view) {  // a new window: the next marks copy
    for (int i : plan_.buckets()[b].params) accumulated_[i].store(0, std::memory_order_relaxed);
  }
  if (config_.keep_shards_only) {
    ReleaseStorage(b);  // a window dropped before its synced backward: storage goes back
    const absl::Status st = ops_.Zero(buckets_[b]->kept.get(), buckets_[b]->kept.bytes());
    if (!st.ok())
      return WithContext(st, absl::StrCat("zeroing the kept shard of ", buckets_[b]->label));
    buckets_[b]->has_partial = false;
    return absl::OkStatus();
  }
  // A bucket whose zeroing failed keeps its partial sum flag: nothing is silently dropped.
  const absl::Status st = ops_.Zero(BucketData(b), plan_.buckets()[b].bytes());
  if (!st.ok()) return WithContext(st, absl::StrCat("zeroing ", buckets_[b]->label));
  buckets_[b]->has_partial = false;
  return absl::OkStatus();
}

absl::Status GradientReducer::SyncZeroing() {
  // Who touches a bucket after its zeroing: the reducer's own operations (packs, the f32
  // widening, the collectives, the unused-parameter fills) are queued on the shard group's
  // comm stream, the same stream as the memset, so stream order puts them after it; the hybrid
  // replica stream only reads a shard after waiting on the reduce-scatter's completion event,
  // which comes after the memset too. With the copy-in path (gradient_as_bucket_view = false)
  // nobody else writes the buckets: no host wait at all. With bucket views the framework
  // writes the gradients from its own streams, which nothing orders with the comm stream:
  // without an event to hand out, the host waits (deadline-bounded) here. ZeroGradsAsync hands
  // out that event instead (the Work's device_event()) and never waits.
  if (ops_.synchronous() || !config_.gradient_as_bucket_view || config_.keep_shards_only)
    return absl::OkStatus();
  return WithContext(ops_.Synchronize(absl::Now() + config_.timeout), "zeroing gradients");
}

}  // namespace braid::sched
