// BucketStorage: where a GradientReducer's buckets live, one interface with two
// implementations, picked once at Create by ReducerConfig::shard_gradients:
//   FullBuckets     (reducer_full_buckets.h) every bucket's full-size storage, and its f32
//                   staging, for the reducer's lifetime: gradients are bucket views.
//   PooledBuckets   (reducer_pooled_buckets.h) full-size storage from a pool, held only while a
//                   bucket is filled and reduced; one kept shard per bucket stays (FSDP).
// The reducer and its launch stages (reducer_stages.h) reach bucket memory only through it.
//
//   ASSIGN_OR_RETURN(auto storage, BucketStorage::Create(config, groups));
//   RETURN_IF_ERROR(storage->Allocate(plan));      // after the plan was agreed
//   RETURN_IF_ERROR(storage->Fill(b));             // before the first write into bucket b
//   ... reduce CommData(b) into CommShard(b), deliver it to Result(b) ...
//   storage->Release(b);                           // nothing reads the full bucket any more
//
// Contract: every operation on the memory is queued on the shard group's BufferOps (its comm
// stream on device), so stream order puts each reuse of pooled storage after every earlier use;
// storage goes back to the pool on the host only after its last use was issued. Data(b) and
// Staging(b) are null while a pooled bucket holds no storage. Fill and Release may run on any
// thread (per bucket they are serialized); the rest follows the reducer's bucket order.
#ifndef BRAID_SCHEDULER_REDUCER_STORAGE_H_
#define BRAID_SCHEDULER_REDUCER_STORAGE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/buffer_ops.h"
#include "comm/tensor.h"
#include "scheduler/bucket_plan.h"
#include "scheduler/reducer_config.h"

namespace braid::sched {

// Bucket storage is allocated in multiples of this (and pooled by that size).
inline constexpr size_t kStorageAlign = 64;
inline size_t AlignedStorageBytes(size_t bytes) {
  return (bytes + kStorageAlign - 1) / kStorageAlign * kStorageAlign;
}

class BucketStorage {
 public:
  // Checks the storage options of `config` and picks the implementation: the one place that
  // reads shard_gradients (reducer_storage_create.cc). Allocates nothing (Allocate does, once
  // the plan is agreed).
  static absl::StatusOr<std::unique_ptr<BucketStorage>> Create(const ReducerConfig& config,
                                                               const ReducerGroups& groups);
  virtual ~BucketStorage() = default;

  // Allocates what lives for the reducer's lifetime, zero-filled (queued). `plan` is the
  // reducer's and stays at its address; the storage reads bucket sizes from it.
  virtual absl::Status Allocate(const BucketPlan& plan) = 0;
  // The same kind with the same options, not allocated yet (a re-plan's new buckets).
  virtual std::unique_ptr<BucketStorage> Fresh() const = 0;
  // OK when gradients can move to a new plan; else FailedPrecondition saying why.
  virtual absl::Status CheckReplan() const = 0;

  // Parameter `i`'s gradient view, valid for the reducer's lifetime, or FailedPrecondition.
  virtual absl::StatusOr<TensorView> GradView(int i) const = 0;
  // Whether MarkReady(id, ready), without the gradient's values, is accepted (inline: every
  // mark asks); else BareMarkError(i) is the FailedPrecondition naming parameter `i`.
  bool takes_bare_marks() const { return takes_bare_marks_; }
  virtual absl::Status BareMarkError(int i) const { return absl::OkStatus(); }
  // Bucket b's full-size storage is there (pooled: taken zero-filled at the first call).
  virtual absl::Status Fill(int b) = 0;
  // Bucket b's f32 staging when b is reduced in f32 (pooled: taken now), else null.
  virtual absl::StatusOr<char*> TakeStaging(int b) = 0;
  // Unmarked parameter `i` at the end of a synced backward: its slot holds zero, or the sum of
  // the window's earlier marks when `accumulated`.
  virtual absl::Status PrepareUnused(int i, bool accumulated) = 0;

  virtual char* Data(int b) const = 0;     // the bucket (padded_count, gradient dtype)
  virtual char* Staging(int b) const = 0;  // its f32 staging, or null
  virtual char* Result(int b) const = 0;   // ShardView(b): this rank's final shard
  // Where the hybrid replica all-reduce runs, in CommDType(b).
  virtual char* ReplicaBuffer(int b) const = 0;
  // Hybrid reduce_scatter_only's partial sum of bucket b (CommDType, shard_count).
  virtual absl::StatusOr<char*> Partial(int b) = 0;
  // Where a hybrid bucket's reduced shard is handed to the replica all-reduce: on the replica
  // group's stream (after waiting for the reduce-scatter), or on the shard group's stream,
  // followed by an event the replica stream waits for (storage read only on the shard stream).
  enum class Handoff { kOnReplicaStream, kOnShardStream };
  virtual Handoff handoff() const = 0;
  // Bucket b's reduction was launched: its full-size storage comes back without the framework
  // (a bounded pool may wait for it). Settled: its Work completed; storage it still holds (a
  // failed bucket's) no longer counts as coming back. Both with the stages' launch order.
  virtual void Launched(int b) {}
  virtual void Settled(int b) {}
  // The full bucket was read for the last time (its result delivered), on the shard stream.
  virtual void Release(int b) = 0;
  // A reduce_scatter_only microbatch's gradients were consumed: the next marks start at zero.
  virtual absl::Status Consume(int b, BufferOps& ops) = 0;
  // A new accumulation window: bucket b's gradients (or kept shard) zeroed, queued.
  virtual absl::Status Zero(int b) = 0;
  // Whether the framework writes the buckets from its own streams (views handed out).
  virtual bool framework_writes() const = 0;
  // Leaks bucket b's memory: a collective may still write into it.
  virtual void Abandon(int b) = 0;

  // The reduction's dtype and buffers: the f32 staging when there is one, else the bucket.
  DType CommDType(int b) const;
  char* CommData(int b) const;
  char* CommShard(int b) const;     // this rank's shard of CommData(b)
  char* StorageShard(int b) const;  // this rank's shard of Data(b)

 protected:
  // `takes_bare_marks`: whether MarkReady(id, ready) (no values) is accepted.
  BucketStorage(BufferOps& ops, const ReducerConfig& config, int shard_rank, bool takes_bare_marks)
      : ops_(ops), config_(config), shard_rank_(shard_rank), takes_bare_marks_(takes_bare_marks) {}
  bool Widened(int b) const;  // bucket b is reduced in f32 staging

  BufferOps& ops_;              // the shard group's
  const ReducerConfig config_;  // a copy (the options the storage reads)
  const int shard_rank_;        // this rank's shard of each bucket (0 in all-reduce mode)
  const bool takes_bare_marks_;
  const BucketPlan* plan_ = nullptr;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_REDUCER_STORAGE_H_
