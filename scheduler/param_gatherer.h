// ParamGatherer: each bucket's full parameters, all-gathered from the ranks' shards in one
// coalesced call straight into a flat buffer (ZeRO-3 / FSDP, out of place from the kept shard;
// in place after a sharded optimizer step, whose shard lives in the full buffer).
//
//   ASSIGN_OR_RETURN(auto gatherer, ParamGatherer::Create(reducer->plan(), gather_group.get(),
//                                                         {absl::Seconds(60),
//                                                          /*fully_sharded=*/true}));
//   ASSIGN_OR_RETURN(TensorView shard, gatherer->ShardView(b));  // the optimizer writes here
//   RETURN_IF_ERROR(gatherer->Prefetch(b));                      // after the step: start early
//   RETURN_IF_ERROR(gatherer->WaitParams(b));                    // before the forward reads b
//   ASSIGN_OR_RETURN(TensorView w, gatherer->ParamView(param_id));
//   RETURN_IF_ERROR(gatherer->Prefetch(b + 1));                  // overlaps the use of b
//   ... layer reads w ...
//   RETURN_IF_ERROR(gatherer->Release(b));                       // ZeRO-3: back to the shard
//
// Contract:
//  - Rank order: ranks match all-gathers by position, so every rank calls Prefetch / WaitParams
//    (the calls that may start a gather) for the same buckets in the same order. Prefetch of a
//    bucket in flight is an error naming it; Create checks the plan on every rank;
//    CheckIssueOrder() (collective) compares the ranks' gathered sequences.
//  - The gatherer's group is its own: nothing else (a reducer included) may use it concurrently.
//  - ShardView(b) is the only place to write parameter values (fixed address); ParamView is for
//    reading, valid after WaitParams(b) and until Release(b) (fully_sharded) or destruction.
//    Between Prefetch(b) and the end of WaitParams(b) the backend writes bucket b and, when
//    fully_sharded, reads its shard: write the shard only when GatherWork(b) is done.
//  - fully_sharded: Release(b) returns the flat buffer to a best-fit pool (reuse_buffers), counted
//    as kParamGather in MemoryStats until TrimPool(). Device groups: buffers are device memory,
//    copies and gathers queue on the comm stream after Prefetch's `ready` event.
//  - Any thread may call; destruction waits (timeout) for gathers in flight.
// Layout, the pool, device ordering and threading in full: docs/design/scheduler.md.
#ifndef BRAID_SCHEDULER_PARAM_GATHERER_H_
#define BRAID_SCHEDULER_PARAM_GATHERER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "comm/tensor.h"
#include "comm/work.h"
#include "scheduler/bucket_plan.h"
#include "scheduler/buffer_pool.h"
#include "scheduler/gather_quant.h"
#include "scheduler/memory_stats.h"
#include "scheduler/op_scheduler.h"
#include "scheduler/timeline.h"

namespace braid::sched {

struct GathererConfig {
  // WaitParams / WaitAll deadline, the destructor's wait, and Create's plan check.
  absl::Duration timeout = absl::Seconds(300);
  // ZeRO-3: Release frees a bucket's full buffer, keeping only this rank's shard.
  bool fully_sharded = false;
  // Optional, not owned, must outlive the gatherer: each all-gather's span on its group's row
  // ("group <name>"), and each WaitParams / WaitAll on the "waits" row.
  Timeline* timeline = nullptr;
  // Collective: verify at Create that every rank of the group holds the same plan (one small
  // all-gather). Turn off only when the plan was verified already on this group.
  bool verify_plan = true;
  // Optional, not owned, must outlive the gatherer's buffers: counts the shards (kParamShards)
  // and the gathered buffers (kParamGather).
  MemoryStats* memory = nullptr;
  // fully_sharded: keep released flat buffers in a pool for later gathers (see above).
  bool reuse_buffers = true;
  // fully_sharded on host groups: released flat buffers go to this pool instead of the
  // gatherer's own, shared with a shard_gradients reducer (scheduler/buffer_pool.h).
  // InvalidArgument at Create on device groups.
  std::shared_ptr<BufferPool> shared_pool;
  // Optional, not owned, must outlive the gatherer: every all-gather is reported to it as
  // urgent (OpScheduler::TrackUrgent), so reductions it schedules wait while gathers run.
  OpScheduler* scheduler = nullptr;
  // fully_sharded f32 buckets: gather each shard as int8 or fp8 with one f32 scale per
  // quant.block elements (ZeRO++'s qwZ, scheduler/gather_quant.h; host groups only), or as
  // bf16 / f16 (cast gathers: host and device groups; on a device the casts are kernels queued
  // on the group's stream around the all-gather, their 2-byte records one device buffer of
  // the largest bucket's size, counted as kStaging until destruction), decoded into the full
  // buffer; every rank (its own block included) reads the same decoded values and the shard (the
  // optimizer's master weights) is never changed. kExact (default): unchanged. InvalidArgument at
  // Create otherwise, naming the bucket or setting; Unimplemented for int8 / fp8 on a device group.
  GatherQuant quant;
};

class ParamGatherer {
 public:
  // The plan is copied. It must be built for shard_group->size() shards (PlanOptions::shards),
  // with buckets in memory the group handles (CPU buckets on CPU groups; CUDA buckets on groups
  // with device_memory, e.g. `nccl`). Collective over shard_group when config.verify_plan.
  // Errors name the group, bucket or parameter at fault.
  static absl::StatusOr<std::unique_ptr<ParamGatherer>> Create(const BucketPlan& plan,
                                                               Group* shard_group,
                                                               const GathererConfig& config);
  ~ParamGatherer();
  ParamGatherer(const ParamGatherer&) = delete;
  ParamGatherer& operator=(const ParamGatherer&) = delete;

  const BucketPlan& plan() const { return plan_; }
  const GathererConfig& config() const { return config_; }
  Group& group() const { return *group_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

  // Parameter `id`'s full values inside its bucket's flat buffer. NotFound for an unknown id;
  // FailedPrecondition when its bucket is released (fully_sharded: call WaitParams first).
  absl::StatusOr<TensorView> ParamView(ParamId id) const;
  // This rank's shard of bucket `b` (shard_count elements; fixed address). OutOfRange for an
  // unknown bucket.
  absl::StatusOr<TensorView> ShardView(int b) const;

  // Starts the all-gather of bucket b and returns without waiting. FailedPrecondition naming the
  // bucket if its gather is already in flight; the backend's error (naming bucket and group) if
  // the launch fails. `ready` (device backends) is an event to wait on before reading the shard.
  // `exact`: this gather moves the shard's exact values even with config.quant (every rank
  // must pass the same; the unit scheduler's GatherAll does, so checkpoints are exact).
  absl::Status Prefetch(int b, DeviceEvent ready = {}, bool exact = false);
  // Returns once bucket b is gathered: at once if it is; starts the gather first if nobody
  // prefetched it. Error naming the bucket and group when the gather fails or does not complete
  // within config.timeout (a gather that is merely late keeps running: a later WaitParams may
  // still succeed).
  absl::Status WaitParams(int b);
  // Waits for every gather in flight (starts none); the first error, or OK.
  absl::Status WaitAll();
  // fully_sharded: frees bucket b's full buffer, keeping the shard. Otherwise a no-op. Either
  // way FailedPrecondition while b's gather is in flight (wait first), OK when already released.
  absl::Status Release(int b);

  // The Work of bucket b's latest gather (null if none was started or b is unknown): for
  // consumers that wait on its device event or completion instead of calling WaitParams.
  WorkPtr GatherWork(int b) const;
  // True once a WaitParams / WaitAll saw bucket b's latest gather complete OK (and b was not
  // released since); a gather that finished unobserved still counts as in flight.
  bool IsGathered(int b) const;
  // Whether gathering bucket b now would take its buffer without waiting on, or growing past
  // the limit of, a bounded shared pool (a prefetch is deferred otherwise). True without one.
  bool PoolFits(int b) const;

  // Collective over the group (call it at the same point on every rank): compares the sequence
  // of buckets every rank has gathered so far. FailedPrecondition naming the group and each
  // rank's recent sequence when they differ (the rank-order contract was broken).
  absl::Status CheckIssueOrder();

  // Collective over the group, serialized with the gathers like every call on it: all-gathers
  // `mine` (the same length on every rank) and returns every rank's values, rank by rank
  // (size() * mine.size() values). For small cross-rank checks (the unit scheduler's order
  // check); `what` labels the collective and prefixes errors.
  absl::StatusOr<std::vector<int64_t>> ExchangeInts(const std::vector<int64_t>& mine,
                                                    absl::string_view what);

  // Bytes of flat buffers attached to buckets now (gathered, in flight, or not yet released)
  // and bytes of free buffers in the pool (fully_sharded). Both are counted as kParamGather.
  int64_t held_bytes() const;
  int64_t pooled_bytes() const;
  // Frees every pooled buffer (and every free buffer of the shared pool, the gradient
  // storage's too).
  void TrimPool();
  // Replaces GathererConfig::scheduler (null: none) for gathers launched from now on; call it
  // between steps (benchmarks compare both on the same buffers).
  void SetScheduler(OpScheduler* scheduler) { scheduler_.store(scheduler); }

 private:
  struct BucketState;
  ParamGatherer(BucketPlan plan, Group* group, const GathererConfig& config);

  absl::Status CheckBucket(const char* what, int b) const;
  // With mu_ held: allocates the buffer if needed and launches bucket b's all-gather.
  absl::Status LaunchLocked(int b, DeviceEvent ready, bool exact = false);
  // With mu_ held: bucket b's quantized all-gather (config_.quant), whose Work completes once
  // `full` (bucket b's flat buffer) holds the dequantized values (param_gatherer_quant.cc).
  // `ready`: device groups wait on it before reading the shard.
  absl::StatusOr<WorkPtr> LaunchQuantizedLocked(int b, char* full, DeviceEvent ready);
  // The same for cast gathers on a device group: narrow, all-gather, widen queued on its stream.
  absl::StatusOr<WorkPtr> LaunchCastOnDeviceLocked(int b, char* full, DeviceEvent ready);
  // Checks config.quant against the plan and group (Create).
  static absl::Status CheckQuant(const BucketPlan& plan, Group& group,
                                 const GathererConfig& config);
  // With mu_ held: bucket b's gather `w` is in flight (state, launch scheduler, issue log,
  // timeline).
  void RecordLaunchLocked(int b, WorkPtr w);
  // Waits for `w` (bucket b's gather) until `deadline` without mu_, then records the outcome.
  // Errors are prefixed with `caller` and name the bucket and group.
  absl::Status AwaitGather(const char* caller, int b, const WorkPtr& w, absl::Time deadline);
  char* ShardData(int b) const;
  // With mu_ held: records bucket b's completed gather on the group's row, once.
  void RecordGatherSpanLocked(int b);

  const BucketPlan plan_;
  Group* const group_;
  const GathererConfig config_;
  std::atomic<OpScheduler*> scheduler_;  // config_.scheduler, or SetScheduler's
  std::vector<std::unique_ptr<BucketState>> buckets_;

  // Timeline rows (valid when config_.timeline is enabled).
  Timeline* tl_ = nullptr;
  int tl_group_ = 0, tl_waits_ = 0;
  // Completion time of the latest gather (set by its completion callback): the group runs its
  // calls in order, so the next gather's span starts at its issue or at this, whichever is later.
  // Shared, because a completion callback may run after this object is gone: callbacks touch
  // only this, and spans are recorded by the thread that observes the completion (a wait).
  std::shared_ptr<std::atomic<int64_t>> tl_last_done_;

  mutable std::mutex mu_;  // bucket states, issue log, and every call on group_
  // Issue log for CheckIssueOrder: count, rolling hash and the latest buckets gathered.
  static constexpr int kRecentIssues = 16;
  uint64_t issued_ = 0;
  uint64_t issue_hash_ = 14695981039346656037ull;  // FNV-1a basis
  std::vector<int64_t> recent_;                    // ring of the last kRecentIssues buckets
  // Device cast gathers' records (all ranks' 2-byte shards of the largest bucket), allocated
  // at the first one and reused in stream order (param_gatherer_quant.cc).
  OwnedBuffer cast_records_;
  // fully_sharded: released flat buffers by byte size (see "Buffer pool").
  std::multimap<size_t, OwnedBuffer> pool_;
  int64_t pooled_bytes_ = 0;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_PARAM_GATHERER_H_
