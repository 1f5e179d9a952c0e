// FullBuckets: the BucketStorage (scheduler/reducer_storage.h) of a reducer without
// shard_gradients. Every bucket's full-size storage (and, for bf16/f16 buckets reduced in f32,
// its staging) is allocated once per plan and lives as long as the reducer: the framework's
// gradients are views into it (or, on the copy-in path, are packed into it), and the reduced
// result stays in it (all-reduce: the whole bucket; reduce-scatter and hybrid: this rank's
// shard, StorageShard(b)). Hybrid reduce_scatter_only sums go to a per-bucket partial buffer,
// allocated at the window's first microbatch and kept.
//
//   BucketStorage::Create(config, groups)  // config.shard_gradients == false picks it
//
// Contract: as BucketStorage. Fill and Release do nothing; Zero zeroes the whole bucket.
#ifndef BRAID_SCHEDULER_REDUCER_FULL_BUCKETS_H_
#define BRAID_SCHEDULER_REDUCER_FULL_BUCKETS_H_

#include <memory>
#include <vector>

#include "scheduler/reducer_storage.h"

namespace braid::sched {

class FullBuckets final : public BucketStorage {
 public:
  FullBuckets(BufferOps& ops, const ReducerConfig& config, int shard_rank)
      : BucketStorage(ops, config, shard_rank, /*takes_bare_marks=*/true) {}

  absl::Status Allocate(const BucketPlan& plan) override;
  std::unique_ptr<BucketStorage> Fresh() const override;
  absl::Status CheckReplan() const override { return absl::OkStatus(); }
  absl::StatusOr<TensorView> GradView(int i) const override;
  absl::Status Fill(int b) override { return absl::OkStatus(); }
  absl::StatusOr<char*> TakeStaging(int b) override { return Staging(b); }
  absl::Status PrepareUnused(int i, bool accumulated) override;
  char* Data(int b) const override { return buckets_[b].data.get(); }
  char* Staging(int b) const override { return buckets_[b].staging.get(); }
  char* Result(int b) const override { return StorageShard(b); }
  char* ReplicaBuffer(int b) const override { return CommShard(b); }
  absl::StatusOr<char*> Partial(int b) override;
  Handoff handoff() const override { return Handoff::kOnReplicaStream; }
  void Release(int b) override {}
  absl::Status Consume(int b, BufferOps& ops) override;
  absl::Status Zero(int b) override;
  bool framework_writes() const override { return true; }
  void Abandon(int b) override;

 private:
  struct Storage {
    OwnedBuffer data;     // padded_count elements, zero-initialized
    OwnedBuffer staging;  // reduce_dtype f32 of a bf16/f16 bucket: the bucket widened
    OwnedBuffer partial;  // hybrid reduce_scatter_only: this rank's shard summed so far
  };
  std::vector<Storage> buckets_;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_REDUCER_FULL_BUCKETS_H_
