// GradientReducer: readiness-driven gradient bucketing and dispatch (DDP, ZeRO-2, HSDP).
//
// RANK-ORDER CONTRACT: buckets launch strictly in bucket-index order on every rank (pending
// counter per bucket + a launch cursor, as PyTorch DDP's reducer does): a bucket whose
// parameters are all ready waits for its predecessors. Readiness may arrive in any order and
// from any thread; the collectives each group sees are therefore issued in the same order on
// every rank. In hybrid mode the replica all-reduce of bucket k starts when its reduce-scatter
// completes, again through a cursor, so it too runs in bucket order, overlapping the
// reduce-scatter of bucket k+1. With ReducerConfig::scheduler each launch becomes a submission
// to the OpScheduler in that same order; it issues each group's submissions (and their
// credit-sized partitions) strictly in submission order (scheduler/op_scheduler.h).
//
//   ReducerConfig cfg;
//   cfg.mode = ReduceMode::kHybrid;
//   ASSIGN_OR_RETURN(Mesh mesh, MakeMesh(*world, 2, 4));
//   ASSIGN_OR_RETURN(auto reducer, GradientReducer::Create(params, {mesh.shard.get(),
//   mesh.replica.get()}, cfg)); ASSIGN_OR_RETURN(TensorView g, reducer->GradView(param_id));  //
//   accumulate gradients here RETURN_IF_ERROR(reducer->BeginBackward(SyncMode::kSync));
//   ... backward hooks: RETURN_IF_ERROR(reducer->MarkReady(param_id));
//   RETURN_IF_ERROR(reducer->FinishBackward());
//   TensorView shard = reducer->ShardView(bucket);  // this rank's averaged gradient shard
//
// Gradients are bucket views (zero copy): Braid owns each bucket's flat storage and hands out
// every parameter's gradient as a view into it; the framework accumulates there.
// Results: all-reduce mode leaves every parameter's averaged gradient in its view;
// reduce-scatter and hybrid modes leave this rank's averaged shard in ShardView(bucket) (the
// rest of the bucket is unspecified until ZeroGrads()). BucketWork(b) completes when bucket b's
// final result is in place: the sharded optimizer consumes these.
// Accumulation: kNoSync backwards communicate nothing; the framework keeps accumulating into
// the views and the next kSync backward reduces the sum (overlapped with that backward).
// kReduceScatterOnly (hybrid mode) reduce-scatters every microbatch within the shard group,
// adds the shard into a per-bucket partial sum and zeroes the bucket for the next microbatch;
// the next kSync backward adds the partial to its own reduced shard *before* the replica
// all-reduce (accumulating after it would drop the other replicas' earlier microbatches).
// Every stage divides by its own group's size (scheduler/divide.h), so the result is the
// average over all ranks of the sum over microbatches, as with kNoSync.
// Call ZeroGrads() after consuming a synced result, before the next accumulation window.
//
// Gradients passed at MarkReady (MarkReady(id, ready, grad), any mode): the framework keeps its
// own gradient and the reducer copies it into the parameter's bucket slot at mark time (device
// buffers: on the comm stream, after waiting for `ready`). The first mark of a parameter in an
// accumulation window copies (-0.0 survives), later marks of the window (no_sync microbatches,
// then the synced one) add, in the gradient dtype, as `slot += grad`.
//
// keep_shards_only (ReducerConfig; FSDP's gradient memory):
//  - Gradients are passed at MarkReady only (GradView and MarkReady(id, ready) refuse).
//  - Full-size storage (the bucket, and with reduce_dtype f32 its f32 staging) comes from a
//    pool of free buffers, reused by equal (aligned) size only; a new one is allocated when none
//    of that size is free, so the pool never holds more than every bucket's storage and staging
//    once, whatever the timing. The pool is never trimmed: MemoryUse::kGradBuckets
//    counts every pool buffer, in use or free. A bucket takes its storage, zero-filled, at its
//    first mark of an accumulation window (the staging when the bucket is complete) and gives
//    it back once this rank's reduced shard was copied out of it, so in a synced backward the
//    pool holds about the buckets in flight at once, not the model.
//  - The kept shard: one per bucket, shard_count elements of the *bucket's* dtype (with
//    reduce_dtype f32 the f32 result is rounded into it once, as in the other modes, so
//    ShardView(b) has the same dtype everywhere), MemoryUse::kGradShards, allocated at Create.
//    Hybrid with reduce_dtype f32 also keeps an f32 shard per bucket (kGradShards): the replica
//    all-reduce and the reduce_scatter_only partial sums run there.
//  - kNoSync keeps a bucket's storage for the whole accumulation window (the marks add into
//    it): that is no_sync's memory cost, as in FSDP (every bucket touched by a no_sync
//    microbatch stays full-size until the synced backward reduces it).
//  - kReduceScatterOnly (hybrid) reduce-scatters every microbatch, adds the reduced shard into
//    the kept shard (its f32 shard with reduce_dtype f32), and returns the storage after each
//    microbatch; the synced backward adds its own reduced shard before the replica all-reduce.
//    Between the microbatches ShardView(b) holds that partial sum.
//  - Unused parameters (allow_unused): zero, from the zero-filled storage.
//  - ZeroBucket(b) / ZeroGrads() zero the kept shards (and give back storage a dropped window
//    still held); they never take full-size storage.
//  - Device ordering: every operation that touches pooled storage (the zero-fill, the copies
//    and adds of MarkReady, the f32 widening, the reduce-scatter, the f16 post-divide, the copy
//    or add into the kept shard) is queued on the shard group's comm stream (its BufferOps).
//    Storage goes back to the pool on the host only after the last of these was *issued*, and
//    the next bucket that takes it issues its own operations (zero-fill first) after taking
//    it, under the pool's lock: stream order puts every reuse after every earlier use. The
//    hybrid replica all-reduce runs on the replica group's stream, so it never reads storage:
//    the reduced shard is copied (or added to the partial sum) into the kept shard on the
//    shard stream, the storage is given back, an event recorded on the shard stream after that
//    copy is waited on by the replica stream, and the replica all-reduce (then the f16 divide
//    and the f32 -> gradient dtype rounding) runs in place on the kept shard. Readers of the
//    kept shard wait on BucketWork(b)'s device event as before; the next backward writes it
//    only after FinishBackward observed that bucket's Work complete.
//
// Device buffers (parameters on a CUDA device, groups with device_memory, e.g. `nccl`): the
// buckets live in device memory and every operation on them (zeroing, packing, the f32
// staging casts, unpacking) is queued through the groups' BufferOps (comm/buffer_ops.h) on the
// comm streams, ordered with the collectives; the host never touches them. MarkReady's event
// is kept with the parameter's bucket and the comm stream waits on every such event before the
// bucket's collective (or before its f32 widening cast); with the copy-in path it waits before
// packing. BucketWork(b) completes once the bucket's last queued operation ran, and its
// device_event() marks that point for consumer streams. f16 buckets (native pre- and
// post-divide), the f32 staging casts and kReduceScatterOnly's partial sums run as Braid's
// kernels on the comm stream, bit for bit with the host (backends/nccl/kernels).
// Zeroing is queued on the comm stream like everything else, so the reducer's own later
// operations are ordered after it. The framework's writes into gradient views come from its
// own streams: ZeroGradsAsync() returns a Work whose device_event() its stream waits on
// before writing (no host wait); ZeroGrads() / ZeroBucket() wait on the host instead
// (deadline-bounded), except with the copy-in path, where nothing but the reducer's own
// stream writes the buckets and they return at once.
#ifndef BRAID_SCHEDULER_GRADIENT_REDUCER_H_
#define BRAID_SCHEDULER_GRADIENT_REDUCER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/buffer_ops.h"
#include "comm/group.h"
#include "comm/tensor.h"
#include "comm/work_pool.h"
#include "scheduler/bucket_plan.h"
#include "scheduler/buffer_pool.h"
#include "scheduler/divide.h"
#include "scheduler/memory_stats.h"
#include "scheduler/op_scheduler.h"
#include "scheduler/timeline.h"

namespace braid::sched {

enum class ReduceMode { kAllReduce, kReduceScatter, kHybrid };
enum class SyncMode { kSync, kNoSync, kReduceScatterOnly };

struct ReducerGroups {
  Group* shard = nullptr;    // all-reduce mode: the data-parallel group; else reduce-scatter group
  Group* replica = nullptr;  // hybrid mode only: the group that all-reduces each shard
};

struct ReducerConfig {
  ReduceMode mode = ReduceMode::kAllReduce;
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t first_bucket_cap_bytes = size_t{1} << 20;
  bool allow_unused = false;  // unmarked parameters are zero-filled and reduced, not an error
  // true (default): gradients are bucket views (zero copy). false: the framework keeps its own
  // gradient buffers (SetGradBuffer); MarkReady packs each into its bucket, and in all-reduce
  // mode the averaged result is unpacked back as each bucket completes.
  bool gradient_as_bucket_view = true;
  // Reduce bf16/f16 gradients in this wider dtype (f32): each such bucket is widened into a
  // staging buffer when it is complete, every stage (collectives, divides, reduce_scatter_only
  // partials) runs there, and the result is rounded to the gradient dtype once at the end.
  // kF16/kBF16 (the default: no staging) or kF32.
  DType reduce_dtype = DType::kBF16;
  // Record the readiness order of the first synced backward; RebuildBucketsIfPending() then
  // rebuilds the buckets in world rank 0's order (DDP's one-time rebuild).
  bool rebuild_bucket_order = false;
  absl::Duration timeout = absl::Seconds(300);  // FinishBackward's deadline
  // Optional, not owned, must outlive the reducer: marks, bucket launches, each collective's
  // span on its group's row, and FinishBackward's wait (see Timeline::FromOptions).
  Timeline* timeline = nullptr;
  // Optional, not owned, must outlive the reducer's buffers: counts every buffer the reducer
  // allocates (buckets, staging, partial sums).
  MemoryStats* memory = nullptr;
  // FSDP's gradient memory (reduce-scatter and hybrid modes only; InvalidArgument otherwise,
  // and with gradient_as_bucket_view = false or rebuild_bucket_order). Full-size bucket
  // storage exists only while a bucket is filled and reduced; what stays is one kept shard per
  // bucket. See "keep_shards_only" below the class comment.
  bool keep_shards_only = false;
  // keep_shards_only on host groups: full-size storage comes from and goes back to this pool,
  // shared with the parameter gatherer (scheduler/buffer_pool.h), instead of the reducer's own.
  // InvalidArgument at Create on device groups or without keep_shards_only.
  std::shared_ptr<BufferPool> shared_pool;
  // Optional, not owned, must outlive the reducer: every reduce-scatter / all-reduce goes
  // through it (credit-sized partitions, priorities; scheduler/op_scheduler.h), still submitted
  // in bucket order. Results are bit for bit those without it (see partition.h).
  OpScheduler* scheduler = nullptr;
};

class GradientReducer {
 public:
  // Collective over the groups: builds the plan and verifies it is identical on every rank.
  // Parameters must have floating dtypes, a device the groups' memory matches (CPU, or CUDA on
  // groups with device_memory), and distinct ids; errors name the offending parameter.
  static absl::StatusOr<std::unique_ptr<GradientReducer>> Create(std::vector<ParamSpec> params,
                                                                 ReducerGroups groups,
                                                                 const ReducerConfig& config);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  const BucketPlan& plan() const { return plan_; }
  // The gradient of `id` inside its bucket (valid for the reducer's lifetime). With
  // keep_shards_only: FailedPrecondition (gradients are passed at MarkReady).
  absl::StatusOr<TensorView> GradView(ParamId id) const;
  // Copy-in path (gradient_as_bucket_view = false): the framework's gradient buffer of `id`
  // (its registered count and dtype), kept alive by the caller. Every parameter needs one
  // before the first BeginBackward.
  absl::Status SetGradBuffer(ParamId id, void* grad);
  // This rank's shard of bucket `b` (reduce-scatter and hybrid modes: after BucketWork(b)).
  // keep_shards_only: the kept shard (valid for the reducer's lifetime).
  TensorView ShardView(int b) const;
  // Bucket b's final reduction in the current (or last) synced backward.
  WorkPtr BucketWork(int b) const;

  absl::Status BeginBackward(SyncMode mode);
  // Any thread, any order, once per parameter per backward. `ready` is a device event to wait
  // on before reading the gradient (device backends; ignored for CPU buffers). It must stay
  // valid until the bucket's collective was issued (FinishBackward returned suffices). In a
  // no_sync backward it is not used: the events of the synced backward that reduces the sum
  // must come after every earlier write (one producer stream, as autograd's, does that).
  // On device a null `ready` is trusted to mean the gradient is complete on the device already:
  // the comm stream is not ordered after the framework's streams by anything else.
  // With keep_shards_only: FailedPrecondition (pass the gradient, below).
  absl::Status MarkReady(ParamId id, DeviceEvent ready = {});
  // The same, passing the framework's gradient of `id` (its registered count and dtype; host
  // memory, or device memory on device reducers): copied (first mark of the accumulation
  // window) or added (later marks) into the parameter's bucket slot now, on the comm stream
  // after waiting for `ready` on device. Host: `grad` may be reused on return. Device: it is
  // read on the shard group's comm stream (buffer_ops().stream()); keep it unmodified until
  // that stream passed the copy: record it there (PyTorch's record_stream), or keep it until a
  // synced FinishBackward returned (every bucket's Work completes after the copies). Every
  // mode; not with the copy-in path
  // (gradient_as_bucket_view = false, which packs the SetGradBuffer buffers instead).
  absl::Status MarkReady(ParamId id, DeviceEvent ready, const void* grad);
  // Returns once every reduction of this backward completed (or the deadline passed: the error
  // names the bucket and group). Unmarked parameters: zero-filled and reduced with
  // allow_unused, else an error naming them.
  absl::Status FinishBackward();
  // Zeroes every bucket (all gradients): the start of a new accumulation window. Device
  // buckets as gradient views: returns once the zeroes landed (a host wait), so the framework
  // may write from any stream afterwards. On device the memsets run on the comm stream, which
  // nothing orders after the framework's reads of the reduced gradients: pass `after`, an event
  // recorded after the last read (null: the reads already finished). Errors name the bucket.
  absl::Status ZeroGrads(DeviceEvent after = {});
  // The same without any host wait: the returned Work completes once the zeroing ran, and on
  // device its device_event() is recorded on the comm stream after it: the framework's stream
  // waits on it (cudaStreamWaitEvent) before writing into the gradient views, and keeps the
  // Work while it may still wait. Host buckets: a completed Work.
  //
  //   ASSIGN_OR_RETURN(WorkPtr zeroed, reducer->ZeroGradsAsync());
  //   cudaStreamWaitEvent(compute, (cudaEvent_t)zeroed->device_event().handle);
  absl::StatusOr<WorkPtr> ZeroGradsAsync(DeviceEvent after = {});
  // Zeroes bucket b only (a sharded optimizer, once it consumed b's shard; its reads are on the
  // comm stream, so ordered). No reduction of b may be in flight.
  absl::Status ZeroBucket(int b);
  ReduceMode mode() const { return config_.mode; }
  absl::Duration timeout() const { return config_.timeout; }
  const ReducerGroups& groups() const { return groups_; }

  // Collective over the reducer's groups; call between steps (after the results were
  // consumed, before the next BeginBackward), at the same point on every rank. After the first
  // synced backward with rebuild_bucket_order, rebuilds the plan in world rank 0's readiness
  // order (parameters never marked go last) and returns true: every GradView, ShardView and
  // bucket index changes, so the framework fetches its gradient views again. Gradient values
  // move with their parameters. Returns false when there is nothing to rebuild.
  absl::StatusOr<bool> RebuildBucketsIfPending();
  // Whether RebuildBucketsIfPending would rebuild now (local; the same answer on every rank
  // between steps).
  bool RebuildPending() const;
  int plan_generation() const { return plan_generation_; }
  // Collective over the reducer's groups, between steps at the same point on every rank (e.g.
  // when an Autotuner adopts a bucket cap, scheduler/autotuner.h): rebuilds the plan with these
  // caps, keeping the current parameter order, and moves every gradient (a no_sync window's sums
  // included) to its new slot, as RebuildBucketsIfPending does. Every GradView, ShardView and
  // bucket index changes. Returns false (nothing changes) when the caps are already these or give
  // the same buckets. FailedPrecondition
  // during a backward, with keep_shards_only, or while a reduce_scatter_only window holds
  // partial shards (they are per bucket). Defined in scheduler/reducer_replan.cc, with the
  // rebuild.
  absl::StatusOr<bool> Replan(size_t bucket_cap_bytes, size_t first_bucket_cap_bytes);
  // Replaces ReducerConfig::scheduler (null: none) between backwards, at the same point on every
  // rank (benchmarks compare both on the same buffers). FailedPrecondition during a backward.
  absl::Status SetScheduler(OpScheduler* scheduler);

 private:
  struct BucketState;
  GradientReducer(BucketPlan plan, ReducerGroups groups, const ReducerConfig& config);

  void OnParamReady(int param_index);
  absl::Status MarkReadyImpl(ParamId id, DeviceEvent ready, const void* grad, bool with_values);
  // keep_shards_only: the pool of free full-size buffers (by equal size), and bucket b's storage.
  // Storage of `bytes` (rounded to the storage alignment: the pool's key) from the pool, or a
  // new allocation when no free buffer has that key.
  absl::StatusOr<OwnedBuffer> PoolAcquire(size_t bytes, int b);
  // Gives back a buffer PoolAcquire(bytes, ...) handed out (the same `bytes`).
  void PoolRelease(OwnedBuffer buffer, size_t bytes);
  absl::Status AcquireStorage(int b);  // zero-filled, when b holds none
  void ReleaseStorage(int b);          // bucket storage and staging back to the pool
  void OnKeptStageDone(int b, int stage, const absl::Status& done);
  // Hybrid: after bucket b's reduce-scatter result is in place for the replicas (st: its
  // error, if any), launch the replica all-reduces that are due, in bucket order.
  void LaunchReplicaStages(int b, const absl::Status& st);
  // keep_shards_only: the comm-dtype shard the replica all-reduce and the partial sums use
  // (the kept shard, or its f32 twin with reduce_dtype f32).
  char* CommKept(int b) const;
  char* StorageShard(int b) const;  // this rank's shard inside the bucket storage
  // With mu_ held: launch bucket b's stage 0 (all-reduce, or reduce-scatter) or stage 1 (the
  // hybrid replica all-reduce), recorded in the bucket's state; buckets [first, last) of a
  // stage are then watched after mu_ is released. Nothing here allocates in steady state.
  void LaunchStageLocked(int b, int stage);
  void Watch(int first, int last, int stage);
  void OnStageDone(int b, int stage, const absl::Status& st);
  // Hybrid reduce_scatter_only: partial (+)= this rank's reduced shard; and, at the synced
  // microbatch, shard = partial + shard before the replica all-reduce.
  absl::Status AccumulatePartial(int b);
  absl::Status AddPartialInto(int b);
  // Copy-in path: framework gradient -> bucket slot, and back (all-reduce mode).
  absl::Status Pack(int param_index);
  absl::Status Unpack(int b);
  // Completes bucket b's Work with `s`, after the operations queued on `ops` (device).
  void FinishBucket(int b, absl::Status s, BufferOps& ops);
  // `st` (a failed memory operation after `collective`) named with the bucket.
  absl::Status OpError(int b, const absl::Status& collective, const absl::Status& st) const;
  absl::Status ZeroBucketQueued(int b);
  absl::Status SyncZeroing();
  void RecordError(const absl::Status& s);
  char* BucketData(int b) const;
  char* ShardData(int b) const;
  // Where bucket b is reduced, and in which dtype: the f32 staging buffer with reduce_dtype,
  // else the bucket itself.
  DType CommDType(int b) const;
  char* CommData(int b) const;
  char* CommShard(int b) const;

  BucketPlan plan_;
  ReducerGroups groups_;
  ReducerConfig config_;
  std::vector<std::unique_ptr<BucketState>> buckets_;
  std::unique_ptr<std::atomic<uint8_t>[]> marked_;  // per parameter, this backward
  // Per parameter: marked in a no_sync backward since the last sync. Atomic: the optimizer's
  // stepper resets a bucket's flags (ZeroBucket) while the framework's thread finishes the
  // backward.
  std::unique_ptr<std::atomic<uint8_t>[]> accumulated_;
  std::vector<void*> external_;  // copy-in path: the framework's gradient buffers
  // Memory operations on the buckets (comm/buffer_ops.h): the shard group's, and where the
  // last stage runs (hybrid: the replica group's; else the same).
  BufferOps& ops_;
  BufferOps& final_ops_;

  // First-backward readiness order (rebuild_bucket_order).
  std::unique_ptr<int[]> ready_order_;
  std::atomic<int> ready_count_{0};
  std::atomic<bool> recording_{false};
  bool rebuild_pending_ = false;
  int plan_generation_ = 0;
  absl::Status AllocateBuckets();
  // Verifies `plan` across the groups, then moves every gradient into its buckets.
  absl::Status AdoptPlan(BucketPlan plan);

  std::atomic<bool> in_backward_{false};
  SyncMode sync_ = SyncMode::kSync;

  // Timeline rows (valid when config_.timeline is enabled).
  Timeline* tl_ = nullptr;
  int tl_marks_ = 0, tl_launches_ = 0, tl_first_ = 0, tl_replica_ = 0, tl_waits_ = 0;

  WorkPool works_;            // each bucket's per-backward result Work
  std::mutex mu_;             // launch cursors and the first error
  int launch_cursor_ = 0;     // next bucket to launch (first stage)
  int allreduce_cursor_ = 0;  // hybrid: next bucket whose replica all-reduce to launch
  absl::Status first_error_;

  // keep_shards_only: free full-size buffers (config.shared_pool, else the reducer's own),
  // keyed by the rounded request they were allocated for. Reuse is by equal key only, so the
  // buffers of a key never outnumber the buckets (and f32 stagings) of that size in use at
  // once, whatever the timing: the pool stays within every bucket's storage once.
  std::shared_ptr<BufferPool> pool_;
  std::atomic<size_t> pool_buffers_{
      0};  // buffers this reducer allocated (Reserve: no allocation in Give)
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_GRADIENT_REDUCER_H_
