// What both bucket storages share: the reduction's dtype and buffers.
#include "scheduler/reducer_storage.h"

namespace braid::sched {

bool BucketStorage::Widened(int b) const {
  return config_.reduce_dtype == DType::kF32 && IsHalf(plan_->buckets()[b].dtype);
}

DType BucketStorage::CommDType(int b) const {
  // The staging rule (pooled buckets hold their staging only while reducing).
  return Widened(b) ? DType::kF32 : plan_->buckets()[b].dtype;
}

char* BucketStorage::CommData(int b) const {
  char* staging = Staging(b);
  return staging != nullptr ? staging : Data(b);
}

char* BucketStorage::StorageShard(int b) const {
  char* data = Data(b);
  if (data == nullptr) return nullptr;  // a pooled bucket between its fills
  const Bucket& bk = plan_->buckets()[b];
  return data + static_cast<size_t>(shard_rank_) * bk.shard_count * DTypeSize(bk.dtype);
}

char* BucketStorage::CommShard(int b) const {
  char* staging = Staging(b);
  if (staging == nullptr) return StorageShard(b);
  return staging + static_cast<size_t>(shard_rank_) * plan_->buckets()[b].shard_count *
                       DTypeSize(DType::kF32);
}

}  // namespace braid::sched
