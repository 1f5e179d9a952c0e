#include "scheduler/reducer_full_buckets.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::sched {

absl::Status FullBuckets::Allocate(const BucketPlan& plan) {
  plan_ = &plan;
  buckets_.clear();
  buckets_.resize(plan.buckets().size());
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bk = plan.buckets()[b];
    const std::string label = absl::StrCat("bucket ", b);
    Storage& s = buckets_[b];
    const size_t bytes = AlignedStorageBytes(bk.bytes());
    ASSIGN_OR_RETURN(s.data,
                     CountedAllocate(config_.memory, ops_, bytes, MemoryUse::kGradBuckets, label));
    RETURN_IF_ERROR(ops_.Zero(s.data.get(), bytes));
    if (Widened(static_cast<int>(b))) {
      ASSIGN_OR_RETURN(
          s.staging, CountedAllocate(config_.memory, ops_, bk.padded_count * DTypeSize(DType::kF32),
                                     MemoryUse::kStaging, absl::StrCat(label, " (f32 staging)")));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<BucketStorage> FullBuckets::Fresh() const {
  return std::make_unique<FullBuckets>(ops_, config_, shard_rank_);
}

absl::StatusOr<TensorView> FullBuckets::GradView(int i) const {
  const ParamSpec& p = plan_->params()[i];
  const ParamSlot& s = plan_->slot(i);
  return TensorView{Data(s.bucket) + s.offset * DTypeSize(p.dtype), p.count, p.dtype, p.device};
}

absl::Status FullBuckets::PrepareUnused(int i, bool accumulated) {
  if (accumulated) return absl::OkStatus();  // the slot holds the window's sum
  const ParamSpec& p = plan_->params()[i];
  const ParamSlot& s = plan_->slot(i);
  return ops_.Zero(Data(s.bucket) + s.offset * DTypeSize(p.dtype), p.count * DTypeSize(p.dtype));
}

absl::StatusOr<char*> FullBuckets::Partial(int b) {
  Storage& s = buckets_[b];
  if (!s.partial) {
    const size_t bytes = plan_->buckets()[b].shard_count * DTypeSize(CommDType(b));
    ASSIGN_OR_RETURN(s.partial, CountedAllocate(config_.memory, ops_, bytes, MemoryUse::kGradShards,
                                                absl::StrCat("bucket ", b, " (partial sum)")));
  }
  return s.partial.get();
}

absl::Status FullBuckets::Consume(int b, BufferOps& ops) {
  return ops.Zero(Data(b), plan_->buckets()[b].bytes());
}

absl::Status FullBuckets::Zero(int b) {
  const absl::Status st = ops_.Zero(Data(b), plan_->buckets()[b].bytes());
  if (!st.ok()) return WithContext(st, absl::StrCat("zeroing bucket ", b));
  return absl::OkStatus();
}

void FullBuckets::Abandon(int b) {
  (void)buckets_[b].data.release();
  (void)buckets_[b].staging.release();
  (void)buckets_[b].partial.release();
}

}  // namespace braid::sched
