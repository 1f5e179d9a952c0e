// GradientReducer: readiness-driven gradient bucketing and reduction (DDP, ZeRO-2, HSDP, and
// FSDP's gradients with shard_gradients). The framework marks each parameter's gradient ready
// during backward; the reducer reduces each bucket once all its parameters are marked.
//
// RANK-ORDER CONTRACT: buckets launch strictly in bucket-index order on every rank (a bucket
// whose parameters are all ready waits for its predecessors), and so do the hybrid replica
// all-reduces; readiness may arrive in any order, from any thread. Every collective a group
// sees is therefore issued in the same order on every rank (scheduler/reducer_stages.h). With
// agree_unused the used-map all-reduce comes first in a declared backward, else after every
// bucket (scheduler/used_map.h).
//
//   ReducerConfig cfg;
//   cfg.mode = ReduceMode::kHybrid;
//   ASSIGN_OR_RETURN(Mesh mesh, MakeMesh(*world, 2, 4));
//   ASSIGN_OR_RETURN(auto reducer, GradientReducer::Create(params, {mesh.shard.get(),
//                                                                   mesh.replica.get()}, cfg));
//   ASSIGN_OR_RETURN(TensorView g, reducer->GradView(id));  // accumulate gradients here
//   RETURN_IF_ERROR(reducer->BeginBackward(SyncMode::kSync));
//   RETURN_IF_ERROR(reducer->MarkReady(id));                // per parameter, from its hook
//   RETURN_IF_ERROR(reducer->FinishBackward());
//   TensorView shard = reducer->ShardView(bucket);         // this rank's averaged shard
//
// Results: all-reduce mode leaves every averaged gradient in its view; reduce-scatter and
// hybrid modes leave this rank's averaged shard in ShardView(b). BucketWork(b) completes when
// bucket b's result is in place (on device, its device_event() marks that point). kNoSync
// backwards communicate nothing and the next kSync one reduces the sum; kReduceScatterOnly
// (hybrid) reduce-scatters every microbatch and adds the shards before the replica all-reduce.
// Each stage divides by its own group's size (divide.h): the result is the average over all
// ranks of the sum over microbatches. Call ZeroGrads() after consuming a synced result.
// Storage (full buckets, or pooled buckets keeping shards): scheduler/reducer_storage.h. The
// accumulation, device-ordering and memory rules in full: docs/design/reducer.md.
#ifndef BRAID_SCHEDULER_GRADIENT_REDUCER_H_
#define BRAID_SCHEDULER_GRADIENT_REDUCER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/buffer_ops.h"
#include "comm/group.h"
#include "comm/tensor.h"
#include "scheduler/bucket_plan.h"
#include "scheduler/reducer_config.h"
#include "scheduler/used_map.h"

namespace braid::sched {

class BucketStorage;
class ReducerMarks;
class CommHook;
class ReducerStages;

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
  // shard_gradients: FailedPrecondition (gradients are passed at MarkReady).
  absl::StatusOr<TensorView> GradView(ParamId id) const;
  // Copy-in path (gradient_as_bucket_view = false): the framework's gradient buffer of `id`
  // (its registered count and dtype), kept alive by the caller. Every parameter needs one
  // before the first BeginBackward.
  absl::Status SetGradBuffer(ParamId id, void* grad);
  // This rank's shard of bucket `b` (reduce-scatter and hybrid modes: after BucketWork(b)).
  // shard_gradients: the kept shard (valid for the reducer's lifetime).
  TensorView ShardView(int b) const;
  // Bucket b's final reduction in the current (or last) synced backward.
  WorkPtr BucketWork(int b) const;

  absl::Status BeginBackward(SyncMode mode);
  // Any thread, any order, once per parameter per backward, or ParamSpec::marks times (a tied
  // or reused parameter; kCountMarks: as often as the first synced backward marked it, whose
  // launches wait for FinishBackward until then): the bucket launches after the last one, and
  // one more is refused with an error naming the parameter (scheduler/reducer_marks.h). `ready` is
  // a device event to wait on before reading the gradient (device backends; ignored for CPU
  // buffers). It must stay valid until the bucket's collective was issued (FinishBackward returned
  // suffices). In a no_sync backward it is not used: the events of the synced backward that reduces
  // the sum must come after every earlier write (one producer stream, as autograd's, does that). On
  // device a null `ready` is trusted to mean the gradient is complete on the device already: the
  // comm stream is not ordered after the framework's streams by anything else. With
  // shard_gradients: FailedPrecondition (pass the gradient, below), unless GradSlot handed out
  // the parameter's slot in this backward (the framework wrote its gradient there).
  absl::Status MarkReady(ParamId id, DeviceEvent ready = {});
  // The same, passing the framework's gradient of `id` (its registered count and dtype; host
  // memory, or device memory on device reducers): copied (first mark of the accumulation
  // window) or added (later marks) into the parameter's bucket slot now, on the comm stream
  // after waiting for `ready` on device. Host: `grad` may be reused on return. Device: it is
  // read on the shard group's comm stream (buffer_ops().stream()); keep it unmodified until
  // that stream passed the copy: record it there (PyTorch's record_stream), or keep it until a
  // synced FinishBackward returned (every bucket's Work completes after the copies). Every
  // mode; not with the copy-in path (gradient_as_bucket_view = false packs SetGradBuffer's).
  absl::Status MarkReady(ParamId id, DeviceEvent ready, const void* grad);
  // shard_gradients: where the framework may compute the gradient of `id` in place instead of
  // passing it at MarkReady(id, ready, grad), saving that copy: the parameter's slot in its
  // bucket's pooled storage, taken now (at a bounded pool's limit this waits, as a mark does).
  // The slot's values are unspecified: the framework writes (never accumulates into) all of it,
  // then marks without values, MarkReady(id, ready) (`ready`: the event after its writes, on
  // device). Valid until that mark, for the window's first contribution only; FailedPrecondition
  // naming the parameter outside a backward, on full buckets (GradView is theirs), for a
  // parameter marked several times per backward (ParamSpec::marks), declared unused, or one that
  // already has a contribution in this accumulation window (no_sync): pass those with values.
  // Device: returns after a host wait for the comm stream (earlier uses of the storage).
  absl::StatusOr<TensorView> GradSlot(ParamId id);
  // Returns once every reduction of this backward completed (or the deadline passed: the error
  // names the bucket and group). Unmarked parameters: zero-filled and reduced with
  // allow_unused, else an error naming them; one marked fewer times than its count: an error
  // naming it (its bucket is not reduced).
  absl::Status FinishBackward();
  // agree_unused = kDeclared: the parameters this rank will not mark in this backward (torch
  // finds them at forward's end). Once per backward on every rank (an empty list too), after
  // BeginBackward and before any MarkReady of it. A synced backward first issues the used-map
  // agreement (scheduler/used_map.h), then zero-fills (unless a no_sync window accumulated into
  // them) and marks the declared parameters, as FinishBackward does unmarked ones; a later
  // MarkReady of one is an error naming it. A no_sync backward ignores the list.
  absl::Status DeclareUnused(const std::vector<ParamId>& ids);
  // agree_unused: the agreement of the last synced backward (used_map().work() completes when
  // it is readable, at the latest when FinishBackward returned): used_map().used(i) is whether
  // some rank used plan index i. Every parameter counts as used before the first agreement.
  const UsedMap& used_map() const { return *used_; }
  // The same by id (NotFound for an unknown id).
  absl::StatusOr<bool> Used(ParamId id) const;
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
  const ReducerConfig& config() const { return config_; }
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
  // Waits (up to `deadline`) until bucket `bucket`'s reduction in the current synced backward
  // completed; its status. Any thread, after the bucket launched and before the backward's
  // FinishBackward returned (the next BeginBackward gives each bucket a new Work): a profiler
  // observes each collective's completion off the backward's thread. OutOfRange for no such
  // bucket.
  absl::Status WaitBucket(int bucket, absl::Time deadline) const;
  int plan_generation() const { return plan_generation_; }
  // Collective over the reducer's groups, between steps at the same point on every rank (e.g.
  // when an Autotuner adopts a bucket cap, scheduler/autotuner.h): rebuilds the plan with these
  // caps, keeping the current parameter order, and moves every gradient (a no_sync window's sums
  // included) to its new slot, as RebuildBucketsIfPending does. Every GradView, ShardView and
  // bucket index changes. Returns false (nothing changes) when the caps are already these or give
  // the same buckets. FailedPrecondition during a backward, with shard_gradients, or while a
  // reduce_scatter_only window holds partial shards (they are per bucket).
  absl::StatusOr<bool> Replan(size_t bucket_cap_bytes, size_t first_bucket_cap_bytes);
  // Whether Replan with these caps would change the buckets (local, and the same answer on
  // every rank: plan data only). InvalidArgument for a zero cap, as Replan.
  absl::StatusOr<bool> ReplanChanges(size_t bucket_cap_bytes, size_t first_bucket_cap_bytes) const;
  // Replaces ReducerConfig::scheduler (null: none) between backwards, at the same point on every
  // rank (benchmarks compare both on the same buffers). FailedPrecondition during a backward.
  absl::Status SetScheduler(OpScheduler* scheduler);
  // Join's divide override (scheduler/join.h sets it from each step's agreement): the synced
  // backwards that follow average over `contributors` ranks (divide.h's StepForContributors)
  // instead of each group's size; 0 restores the groups' sizes. Between backwards, the same
  // value on every rank. InvalidArgument outside [0, world size].
  absl::Status SetContributors(int contributors);
  // Collective over the reducer's groups, between backwards at the same point on every rank:
  // `hook` (null: none) runs the bucket stages it handles from the next backward on, after every
  // rank was verified to register the same one (scheduler/comm_hook.h). FailedPrecondition
  // during a backward or when ranks differ; Unimplemented on device buckets; InvalidArgument
  // when it handles none of this mode's stages.
  absl::Status SetCommHook(std::shared_ptr<CommHook> hook);

 private:
  GradientReducer(BucketPlan plan, ReducerGroups groups, const ReducerConfig& config,
                  std::unique_ptr<BucketStorage> storage);

  absl::Status MarkReadyImpl(ParamId id, DeviceEvent ready, const void* grad, bool with_values);
  absl::Status Pack(int param_index);  // copy-in path: framework gradient -> bucket slot
  absl::Status ZeroBucketQueued(int b);
  // Zero-fills (or keeps the no_sync sum of) unmarked parameter i, marks it and counts it ready;
  // `caller` names the call in a failure.
  void ReduceUnmarked(int i, const char* caller);
  absl::Status SyncZeroing();
  // The plan Replan(caps) adopts, keeping the parameter order; nullopt when the caps are
  // already these or give the same buckets.
  absl::StatusOr<std::optional<BucketPlan>> PlanForCaps(size_t bucket_cap_bytes,
                                                        size_t first_bucket_cap_bytes) const;
  // Verifies `plan` across the groups, then moves every gradient into its buckets.
  absl::Status AdoptPlan(BucketPlan plan);

  BucketPlan plan_;
  ReducerGroups groups_;
  ReducerConfig config_;
  std::unique_ptr<ReducerMarks> marks_;  // per parameter: marks this backward, and expected
  // Per parameter: marked in a no_sync backward since the last sync. Atomic: the optimizer's
  // stepper resets a bucket's flags (ZeroBucket) while the framework's thread finishes the
  // backward.
  std::unique_ptr<std::atomic<uint8_t>[]> accumulated_;
  // Per parameter: GradSlot handed out its slot in this backward; its values-less mark is taken.
  std::unique_ptr<std::atomic<uint8_t>[]> slot_taken_;
  std::vector<void*> external_;  // copy-in path: the framework's gradient buffers
  BufferOps& ops_;               // the shard group's memory operations

  // First-backward readiness order (rebuild_bucket_order).
  std::unique_ptr<int[]> ready_order_;
  std::atomic<int> ready_count_{0};
  std::atomic<bool> recording_{false};
  bool rebuild_pending_ = false;
  int plan_generation_ = 0;

  std::atomic<bool> in_backward_{false};
  std::atomic<bool> declared_{false};  // DeclareUnused ran in this backward
  std::unique_ptr<UsedMap> used_;      // the used-map agreement (agree_unused)
  SyncMode sync_ = SyncMode::kSync;

  // Timeline rows (valid when config_.timeline is enabled).
  Timeline* tl_ = nullptr;
  int tl_marks_ = 0, tl_waits_ = 0;

  // Declared last: the stages (whose destructor waits for buckets in flight) go first, then
  // the storage they reduce in.
  std::unique_ptr<BucketStorage> storage_;
  std::unique_ptr<ReducerStages> stages_;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_GRADIENT_REDUCER_H_
