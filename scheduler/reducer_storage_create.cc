// BucketStorage::Create: the choice between full and pooled buckets, the one place that reads
// ReducerConfig::shard_gradients (kept apart from reducer_storage.cc so the interface knows
// nothing of its implementations).
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/reducer_full_buckets.h"
#include "scheduler/reducer_pooled_buckets.h"
#include "scheduler/reducer_storage.h"

namespace braid::sched {

absl::StatusOr<std::unique_ptr<BucketStorage>> BucketStorage::Create(const ReducerConfig& config,
                                                                     const ReducerGroups& groups) {
  BufferOps& ops = groups.shard->buffer_ops();
  const int shard_rank = config.mode == ReduceMode::kAllReduce ? 0 : groups.shard->rank();
  if (!config.shard_gradients) {
    if (config.shared_pool != nullptr) {
      return absl::InvalidArgumentError(
          "shared_pool is for shard_gradients reducers on host groups (device groups queue "
          "their operations on different streams)");
    }
    if (config.pool_limit_bytes != 0) {
      return absl::InvalidArgumentError(
          "pool_limit_bytes bounds the pooled storage of shard_gradients reducers");
    }
    return std::unique_ptr<BucketStorage>(new FullBuckets(ops, config, shard_rank));
  }
  if (config.mode == ReduceMode::kAllReduce) {
    return absl::InvalidArgumentError(
        "shard_gradients needs reduce-scatter or hybrid mode: all-reduce keeps whole gradients");
  }
  if (!config.gradient_as_bucket_view) {
    return absl::InvalidArgumentError(
        "shard_gradients passes gradients at braid_reducer_mark_ready_grad: it does not use the "
        "copy-in path (gradient_as_bucket_view = false)");
  }
  if (config.rebuild_bucket_order) {
    return absl::InvalidArgumentError(
        "shard_gradients does not rebuild the bucket order (rebuild_bucket_order): buckets "
        "hold no full-size storage between backwards to move gradients through");
  }
  if (config.shared_pool != nullptr && !ops.synchronous()) {
    return absl::InvalidArgumentError(
        "shared_pool is for shard_gradients reducers on host groups (device groups queue their "
        "operations on different streams)");
  }
  if (config.pool_limit_bytes < 0 ||
      (config.shared_pool != nullptr && config.pool_limit_bytes != 0 &&
       config.pool_limit_bytes != config.shared_pool->limit_bytes())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool_limit_bytes ", config.pool_limit_bytes,
        config.pool_limit_bytes < 0 ? " is negative (0: no limit)"
                                    : absl::StrCat(" differs from the shared_pool's limit of ",
                                                   config.shared_pool->limit_bytes(),
                                                   " bytes (set it when creating the pool)")));
  }
  return std::unique_ptr<BucketStorage>(new PooledBuckets(ops, config, shard_rank));
}

}  // namespace braid::sched
