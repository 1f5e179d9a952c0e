#include "scheduler/reducer_pooled_buckets.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::sched {

PooledBuckets::PooledBuckets(BufferOps& ops, const ReducerConfig& config, int shard_rank)
    : BucketStorage(ops, config, shard_rank, /*takes_bare_marks=*/false),
      pool_(config.shared_pool ? config.shared_pool
                               : std::make_shared<BufferPool>(BufferPool::Options{
                                     config.pool_limit_bytes, config.memory})) {}

PooledBuckets::~PooledBuckets() {
  // A shared pool outlives this storage: what it counted as coming back no longer will, and
  // storage still attached (a no_sync window, a failed step) is freed and leaves its count, as
  // the gatherer's does. Storage a collective may still write into was released (Abandon).
  // plan_ may be another plan by now (a re-plan destroys the old storage after it): the keys
  // were recorded at Take.
  for (auto& s : buckets_) {
    std::lock_guard<std::mutex> lock(s->mu);
    EndReturningLocked(*s);
    for (auto [buffer, key] :
         {std::pair<OwnedBuffer*, size_t>{&s->data, s->data_key}, {&s->staging, s->staging_key}}) {
      if (!*buffer) continue;
      buffer->Reset();
      pool_->Unhold(key);
    }
  }
}

absl::Status PooledBuckets::Allocate(const BucketPlan& plan) {
  plan_ = &plan;
  buckets_.clear();
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bk = plan.buckets()[b];
    auto s = std::make_unique<Storage>();
    const size_t kept = bk.shard_count * DTypeSize(bk.dtype);
    ASSIGN_OR_RETURN(s->kept, CountedAllocate(config_.memory, ops_, kept, MemoryUse::kGradShards,
                                              absl::StrCat("bucket ", b, " (kept shard)")));
    RETURN_IF_ERROR(ops_.Zero(s->kept.get(), kept));
    if (config_.mode == ReduceMode::kHybrid && Widened(static_cast<int>(b))) {
      ASSIGN_OR_RETURN(
          s->reduced,
          CountedAllocate(config_.memory, ops_, bk.shard_count * DTypeSize(DType::kF32),
                          MemoryUse::kGradShards, absl::StrCat("bucket ", b, " (f32 shard)")));
    }
    // The gaps no parameter covers (alignment and the shard padding): Fill zeroes only these,
    // since every slot is written by its first mark (a copy) or zeroed by PrepareUnused.
    std::vector<std::pair<size_t, size_t>> slots;  // [offset, end) in elements
    for (int i : bk.params) {
      const ParamSlot& ps = plan.slot(i);
      slots.emplace_back(ps.offset, ps.offset + plan.params()[i].count);
    }
    std::sort(slots.begin(), slots.end());
    size_t at = 0;
    for (const auto& [begin, end] : slots) {
      if (begin > at) s->gaps.push_back({at, begin - at});
      at = std::max(at, end);
    }
    if (bk.padded_count > at) s->gaps.push_back({at, bk.padded_count - at});
    buckets_.push_back(std::move(s));
  }
  pool_->Reserve(2 * buckets_.size());
  const int64_t limit = pool_->limit_bytes();
  for (size_t b = 0; limit > 0 && b < buckets_.size(); ++b) {
    // What one bucket holds at once: it must fit, or every take would pass the limit.
    const Bucket& bk = plan.buckets()[b];
    int64_t need = static_cast<int64_t>(AlignedStorageBytes(bk.bytes()));
    if (Widened(static_cast<int>(b))) {
      need += static_cast<int64_t>(AlignedStorageBytes(bk.padded_count * DTypeSize(DType::kF32)));
    }
    if (need > limit) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool_limit_bytes ", limit, " is below the ", need,
                       " bytes of full-size storage that bucket ", b, " holds while reduced"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<BucketStorage> PooledBuckets::Fresh() const {
  return std::make_unique<PooledBuckets>(ops_, config_, shard_rank_);
}

absl::Status PooledBuckets::CheckReplan() const {
  return absl::FailedPreconditionError(
      "a shard_gradients reducer does not re-plan: buckets hold no full-size storage to move "
      "gradients through");
}

absl::StatusOr<TensorView> PooledBuckets::GradView(int i) const {
  return absl::FailedPreconditionError(
      absl::StrCat("parameter ", plan_->params()[i].Label(),
                   ": with shard_gradients gradients are passed at "
                   "braid_reducer_mark_ready_grad, or written in place into "
                   "braid_reducer_grad_slot; buckets hold no storage between backwards"));
}

absl::Status PooledBuckets::BareMarkError(int i) const {
  return absl::FailedPreconditionError(
      absl::StrCat("parameter ", plan_->params()[i].Label(),
                   " marked ready without its gradient: with shard_gradients pass it with "
                   "braid_reducer_mark_ready_grad, or write it into braid_reducer_grad_slot "
                   "first"));
}

absl::StatusOr<OwnedBuffer> PooledBuckets::Take(size_t bytes, int b) {
  bytes = AlignedStorageBytes(bytes);
  // At the pool's limit this waits for a launched bucket's storage (never for one not launched:
  // see buffer_pool.h).
  absl::StatusOr<OwnedBuffer> pooled = pool_->Acquire(bytes, config_.timeout);
  if (!pooled.ok()) {
    return absl::Status(
        pooled.status().code(),
        absl::StrCat("bucket ", b, " (pooled gradient storage): ", pooled.status().message(),
                     "; raise pool_limit_bytes (0: no limit) or the reducer's timeout"));
  }
  if (*pooled) return *std::move(pooled);
  // None free: the pool grows (never in steady state).
  absl::StatusOr<OwnedBuffer> out =
      CountedAllocate(config_.memory, ops_, bytes, MemoryUse::kGradBuckets,
                      absl::StrCat("bucket ", b, " (pooled gradient storage)"));
  if (!out.ok()) {
    pool_->Unhold(bytes);
    return out.status();
  }
  pool_->Reserve(++pool_buffers_);  // giving it back never allocates
  return out;
}

void PooledBuckets::Give(OwnedBuffer buffer, size_t bytes) {
  if (!buffer) return;
  pool_->Give(std::move(buffer), AlignedStorageBytes(bytes));
}

void PooledBuckets::EndReturningLocked(Storage& s) {
  if (s.data_returning) pool_->EndReturning(s.data_key);
  if (s.staging_returning) pool_->EndReturning(s.staging_key);
  s.data_returning = s.staging_returning = false;
}

void PooledBuckets::Launched(int b) {
  Storage& s = *buckets_[b];
  std::lock_guard<std::mutex> lock(s.mu);
  s.data_returning = static_cast<bool>(s.data);
  s.staging_returning = static_cast<bool>(s.staging);
  if (s.data_returning) pool_->StartReturning(s.data_key);
  if (s.staging_returning) pool_->StartReturning(s.staging_key);
}

void PooledBuckets::Settled(int b) {
  Storage& s = *buckets_[b];
  std::lock_guard<std::mutex> lock(s.mu);
  EndReturningLocked(s);
}

absl::Status PooledBuckets::Fill(int b) {
  Storage& s = *buckets_[b];
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.data) return absl::OkStatus();
  const size_t bytes = plan_->buckets()[b].bytes();
  ASSIGN_OR_RETURN(OwnedBuffer data, Take(bytes, b));
  s.data_key = AlignedStorageBytes(bytes);
  // The gaps zero-filled before any mark writes (issued under the lock: marks of this bucket on
  // other threads issue their copies after it); the slots are written by their marks.
  const size_t es = DTypeSize(plan_->buckets()[b].dtype);
  absl::Status st;
  for (const Gap& g : s.gaps) {
    st = ops_.Zero(data.get() + g.offset * es, g.count * es);
    if (!st.ok()) break;
  }
  if (!st.ok()) {
    Give(std::move(data), bytes);
    return WithContext(st, absl::StrCat("zero-filling the storage of bucket ", b));
  }
  s.data = std::move(data);
  return absl::OkStatus();
}

absl::StatusOr<char*> PooledBuckets::TakeStaging(int b) {
  if (!Widened(b)) return nullptr;
  Storage& s = *buckets_[b];
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.staging) {
    const size_t bytes = plan_->buckets()[b].padded_count * DTypeSize(DType::kF32);
    ASSIGN_OR_RETURN(s.staging, Take(bytes, b));
    s.staging_key = AlignedStorageBytes(bytes);
  }
  return s.staging.get();
}

absl::Status PooledBuckets::PrepareUnused(int i, bool accumulated) {
  // The slot holds the no_sync sum when `accumulated`; else nothing wrote it: zero it.
  const ParamSlot& slot = plan_->slot(i);
  RETURN_IF_ERROR(Fill(slot.bucket));
  if (accumulated) return absl::OkStatus();
  const size_t es = DTypeSize(plan_->params()[i].dtype);
  return ops_.Zero(Data(slot.bucket) + slot.offset * es, plan_->params()[i].count * es);
}

char* PooledBuckets::ReplicaBuffer(int b) const {
  const Storage& s = *buckets_[b];
  return s.reduced ? s.reduced.get() : s.kept.get();
}

void PooledBuckets::Release(int b) {
  Storage& s = *buckets_[b];
  std::lock_guard<std::mutex> lock(s.mu);
  struct Held {
    OwnedBuffer* buffer;
    size_t key;
    bool* returning;  // a launched bucket's: its waiters are told
  };
  for (Held h : {Held{&s.staging, s.staging_key, &s.staging_returning},
                 Held{&s.data, s.data_key, &s.data_returning}}) {
    if (!*h.buffer) continue;
    pool_->Give(std::move(*h.buffer), h.key, *h.returning);
    *h.returning = false;
    h.buffer->Reset();
  }
  EndReturningLocked(s);
}

absl::Status PooledBuckets::Consume(int b, BufferOps& ops) {
  Release(b);  // the next microbatch takes zero-filled storage again
  return absl::OkStatus();
}

absl::Status PooledBuckets::Zero(int b) {
  Release(b);  // a window dropped before its synced backward: storage goes back
  Storage& s = *buckets_[b];
  const absl::Status st = ops_.Zero(s.kept.get(), s.kept.bytes());
  if (!st.ok()) return WithContext(st, absl::StrCat("zeroing the kept shard of bucket ", b));
  return absl::OkStatus();
}

void PooledBuckets::Abandon(int b) {
  Storage& s = *buckets_[b];
  {
    std::lock_guard<std::mutex> lock(s.mu);
    EndReturningLocked(s);  // leaked: it never comes back
  }
  (void)s.data.release();
  (void)s.staging.release();
  (void)s.kept.release();
  (void)s.reduced.release();
  pool_->Abandon();  // storage given back while still in use
}

}  // namespace braid::sched
