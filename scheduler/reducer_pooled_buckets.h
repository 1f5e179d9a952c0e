// PooledBuckets: the BucketStorage (scheduler/reducer_storage.h) of a shard_gradients reducer,
// FSDP's gradient memory.
//  - Gradients are passed at MarkReady, or written in place into GradientReducer::GradSlot's
//    slot of the storage before a values-less mark (GradView refuses: no storage between
//    backwards; so does a values-less mark without a slot).
//  - Full-size storage (the bucket, and with reduce_dtype f32 its staging) comes from a pool of
//    free buffers (ReducerConfig::shared_pool, else the storage's own), reused by equal aligned
//    size only: a new one is allocated when none of that size is free, so the pool never holds
//    more than every bucket's storage and staging once, whatever the timing. The pool is never
//    trimmed (MemoryUse::kGradBuckets counts every pool buffer, in use or free); a bounded one
//    frees free buffers of other sizes at its limit (buffer_pool.h). A bucket takes
//    its storage at its first mark of an accumulation window (the staging when the bucket is
//    complete), zero-filling only the gaps between and after its slots (each slot is written by
//    its first mark, or zeroed as unused), and gives it back once this rank's reduced shard was
//    copied out.
//  - The kept shard: one per bucket, shard_count elements of the bucket's dtype (kGradShards,
//    allocated with the plan). Hybrid with reduce_dtype f32 also keeps an f32 shard per bucket:
//    the replica all-reduce and the reduce_scatter_only partial sums run there.
//  - Bounded pool (ReducerConfig::pool_limit_bytes, or the shared pool's limit): where taking
//    storage would grow the pool past its limit, Fill / TakeStaging wait for the storage of a
//    bucket already launched to come back (Launched .. Release / Settled), up to the reducer's
//    timeout (DeadlineExceeded naming the bucket and pool_limit_bytes); never for a bucket not
//    yet launched, and with nothing in flight the pool grows (MemoryStats::pool_over_limit).
//  - kNoSync keeps a bucket's storage for the whole window (no_sync's memory cost, as in
//    FSDP); kReduceScatterOnly adds each microbatch's reduced shard into the kept one and gives
//    the storage back after each microbatch. Unused parameters' slots are zeroed when reduced.
//
//   config.shard_gradients = true;  // BucketStorage::Create picks it
//
// Contract: as BucketStorage; Zero zeroes the kept shard and gives back storage a dropped
// window still held, never taking full-size storage. Destruction frees storage still attached
// and takes it out of the pool's held bytes (a shared pool lives on: its limit is for the
// storage that exists).
#ifndef BRAID_SCHEDULER_REDUCER_POOLED_BUCKETS_H_
#define BRAID_SCHEDULER_REDUCER_POOLED_BUCKETS_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "scheduler/buffer_pool.h"
#include "scheduler/reducer_storage.h"

namespace braid::sched {

class PooledBuckets final : public BucketStorage {
 public:
  PooledBuckets(BufferOps& ops, const ReducerConfig& config, int shard_rank);
  ~PooledBuckets() override;

  absl::Status Allocate(const BucketPlan& plan) override;
  std::unique_ptr<BucketStorage> Fresh() const override;
  absl::Status CheckReplan() const override;
  absl::StatusOr<TensorView> GradView(int i) const override;
  absl::Status BareMarkError(int i) const override;
  absl::Status Fill(int b) override;
  absl::StatusOr<char*> TakeStaging(int b) override;
  absl::Status PrepareUnused(int i, bool accumulated) override;
  char* Data(int b) const override { return buckets_[b]->data.get(); }
  char* Staging(int b) const override { return buckets_[b]->staging.get(); }
  char* Result(int b) const override { return buckets_[b]->kept.get(); }
  char* ReplicaBuffer(int b) const override;
  absl::StatusOr<char*> Partial(int b) override { return ReplicaBuffer(b); }
  Handoff handoff() const override { return Handoff::kOnShardStream; }
  void Launched(int b) override;
  void Settled(int b) override;
  void Release(int b) override;
  absl::Status Consume(int b, BufferOps& ops) override;
  absl::Status Zero(int b) override;
  bool framework_writes() const override { return false; }
  void Abandon(int b) override;

 private:
  struct Gap {
    size_t offset, count;  // elements
  };
  struct Storage {
    std::vector<Gap> gaps;        // what no parameter's slot covers (Allocate)
    std::mutex mu;                // serializes taking and giving back data / staging
    OwnedBuffer data;             // from the pool while the bucket is filled and reduced
    OwnedBuffer staging;          // from the pool while a widened bucket is reduced
    OwnedBuffer kept;             // this rank's reduced shard (shard_count, bucket dtype)
    OwnedBuffer reduced;          // hybrid with f32 staging: the f32 shard
    bool data_returning = false;  // counted as coming back (BufferPool), each
    bool staging_returning = false;
    size_t data_key = 0, staging_key = 0;  // their pool keys (aligned bytes), set at Take
  };
  void EndReturningLocked(Storage& s);
  // Storage of `bytes` (aligned: the pool's key) from the pool, or a new allocation.
  absl::StatusOr<OwnedBuffer> Take(size_t bytes, int b);
  void Give(OwnedBuffer buffer, size_t bytes);

  std::vector<std::unique_ptr<Storage>> buckets_;
  std::shared_ptr<BufferPool> pool_;
  std::atomic<size_t> pool_buffers_{0};  // buffers this storage allocated (Reserve'd ahead)
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_REDUCER_POOLED_BUCKETS_H_
