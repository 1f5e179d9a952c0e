// ReducerStages: a GradientReducer's launch side. Counts each bucket's marked parameters,
// launches complete buckets in bucket order, and runs what follows each collective: the f16
// post-divide, the delivery of the result (rounded from f32 staging, copied into a kept shard,
// unpacked on the copy-in path), reduce_scatter_only's partial sums, the hybrid replica
// all-reduce, and the completion of each bucket's Work.
//
// RANK-ORDER CONTRACT: buckets launch strictly in bucket-index order on every rank (a pending
// counter per bucket and a launch cursor, as PyTorch DDP's reducer does): a bucket whose
// parameters are all ready waits for its predecessors. In hybrid mode the replica all-reduce of
// bucket k starts when its reduce-scatter completed, through a second cursor, so it too runs in
// bucket order (overlapping the reduce-scatter of bucket k+1). With an OpScheduler each launch is
// a submission to it in that same order (scheduler/op_scheduler.h).
//
//   ReducerStages stages(plan, groups, config, external, timeline, rows);
//   stages.Reset(*storage);           // after every plan change
//   RETURN_IF_ERROR(stages.Begin(SyncMode::kSync, "braid_reducer_begin_backward"));
//   stages.ParamReady(b);             // per marked parameter of bucket b, any thread
//   ... stages.work(b)->WaitUntil(deadline) for b < stages.launched() ...
//
// Contract: ParamReady may be called from any thread; completion callbacks run on the
// backends' threads. Memory is reached only through the BucketStorage. A bucket's reduction is
// in flight from its launch until its Work completed: a backward whose wait failed at its
// deadline can leave it so, and then Begin and a re-plan are refused (NoneInFlight) rather than
// reuse the storage under it. The destructor waits (up to the timeout) for every reduction in
// flight, then leaks the storage of any still running, and a late completion finds no stages.
#ifndef BRAID_SCHEDULER_REDUCER_STAGES_H_
#define BRAID_SCHEDULER_REDUCER_STAGES_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "comm/buffer_ops.h"
#include "comm/work_pool.h"
#include "scheduler/bucket_plan.h"
#include "scheduler/reducer_bucket_state.h"
#include "scheduler/reducer_config.h"
#include "scheduler/reducer_storage.h"

namespace braid::sched {

class ReducerStages {
 public:
  struct Rows {  // timeline rows (used when the timeline is non-null)
    int launches = 0, shard = 0, replica = 0;
  };
  // `plan`, `config` and `external` (the copy-in path's gradient buffers) are the reducer's and
  // outlive the stages; the timeline may be null.
  ReducerStages(const BucketPlan& plan, const ReducerGroups& groups, const ReducerConfig& config,
                const std::vector<void*>& external, Timeline* timeline, Rows rows);
  ~ReducerStages();
  ReducerStages(const ReducerStages&) = delete;
  ReducerStages& operator=(const ReducerStages&) = delete;

  // The buckets of the current plan, over `storage` (after Create and after each re-plan).
  // `layout_changed`: the buckets differ from the last Reset's (the hook's OnReplan runs).
  void Reset(BucketStorage& storage, bool layout_changed = true);
  // A new backward: every bucket's counters and flags, and (unless kNoSync) a fresh Work.
  // FailedPrecondition (naming the bucket, `caller` first) while a reduction of an earlier
  // backward is in flight; nothing is changed then.
  absl::Status Begin(SyncMode mode, absl::string_view caller);
  // OK when no bucket's reduction is in flight (see the contract above), else
  // FailedPrecondition naming the first such bucket, `doing` first: before anything replaces
  // the storage or the bucket states.
  absl::Status NoneInFlight(absl::string_view doing);
  // The same for bucket b alone (zeroing it must not race its reduction).
  absl::Status BucketIdle(int b, absl::string_view doing);
  // A device event that bucket b's collective waits for (one per marked parameter at most).
  void AddEvent(int b, DeviceEvent ready);
  // One more parameter of bucket b is ready: the last one widens b (f32 staging) and launches
  // every complete bucket whose predecessors launched.
  void ParamReady(int b);
  int launched();              // buckets launched in this backward
  WorkPtr work(int b) const;   // bucket b's final result in this (or the last) backward
  absl::Status first_error();  // the first failure of a bucket in this backward
  void RecordError(const absl::Status& s);
  int FirstPartial() const;  // a bucket holding a reduce_scatter_only sum, or -1
  void ClearPartial(int b) { buckets_[b]->has_partial = false; }
  void SetScheduler(OpScheduler* scheduler);
  // Join's divide override (divide.h's StepForContributors) for the launches that follow; 0:
  // each group's size. Between backwards.
  void SetContributors(int contributors);
  // Replaces the comm hook (null: the default collectives), between backwards.
  void SetCommHook(std::shared_ptr<CommHook> hook);
  WorkPtr NewWork(WorkInfo info) { return works_.Create(std::move(info)); }

 private:
  // With mu_ held: launch bucket b's stage 0 (all-reduce, or reduce-scatter) or stage 1 (the
  // hybrid replica all-reduce); buckets [first, last) of a stage are then watched after mu_ is
  // released. Nothing here allocates in steady state.
  void LaunchStageLocked(int b, int stage);
  // Where bucket b's reduce-scatter writes: its final place (Result) when the result lands
  // there unconverted (reduce_scatter mode, the bucket's own dtype): the kept shard of pooled
  // storage, without a copy; else this rank's shard of the comm buffer.
  char* ShardRecv(int b) const;
  void Watch(int first, int last, int stage);
  // With mu_ held: bucket b's reduction was launched and has not completed (its final Work,
  // or a collective of one of its stages).
  bool InFlightLocked(int b) const;
  absl::Status NoneInFlightLocked(absl::string_view doing) const;
  absl::Status InFlightError(int b, absl::string_view doing) const;
  // With mu_ held: the comm hook runs bucket b's `stage` (reducer_hook_stage.cc); a hook's
  // error comes back as a completed Work, named at delivery.
  WorkPtr RunHookLocked(int b, int stage, const ReductionRequest& req);
  // After a hooked stage completed with `done`: the hook's result into the stage's buffer, or
  // the error naming the bucket and the hook.
  absl::Status DeliverHook(int b, int stage, const absl::Status& done);
  void OnStageDone(int b, int stage, const absl::Status& done);
  void OnReplicaStageDone(int b, const absl::Status& done);
  // Hybrid: after bucket b's reduce-scatter result is in place for the replicas (st: its
  // error, if any), launch the replica all-reduces that are due, in bucket order.
  void LaunchReplicaStages(int b, const absl::Status& st);
  absl::Status Unpack(int b);  // copy-in path, all-reduce mode: bucket -> framework buffers
  // Completes bucket b's Work with `s`, after the operations queued on `ops` (device).
  void FinishBucket(int b, absl::Status s, BufferOps& ops);
  // `st` (a failed memory operation after `collective`) named with the bucket.
  absl::Status OpError(int b, const absl::Status& collective, const absl::Status& st) const;

  const BucketPlan& plan_;
  const ReducerGroups groups_;
  const ReducerConfig& config_;
  const std::vector<void*>& external_;
  BucketStorage* storage_ = nullptr;
  // Memory operations (comm/buffer_ops.h): the shard group's, and where the last stage runs
  // (hybrid: the replica group's; else the same).
  BufferOps& ops_;
  BufferOps& final_ops_;
  Timeline* tl_;
  const Rows rows_;
  SyncMode sync_ = SyncMode::kSync;  // set by Begin, before any launch of the backward

  // What a collective's completion callback reaches (Watch): these stages while they live. The
  // destructor detaches it, waiting for callbacks already inside; a collective still running
  // then finds no stages when it completes, and the last of the anchor's holders frees it.
  struct CallbackAnchor {
    static void Release(CallbackAnchor* anchor);  // one holder less; the last one deletes
    std::atomic<int> refs{1};    // the stages, and each callback registered and not yet run
    std::atomic<int> active{0};  // callbacks inside OnStageDone
    std::atomic<bool> detached{false};
    ReducerStages* stages = nullptr;
  };
  CallbackAnchor* anchor_;  // shared with the callbacks (refs)

  std::vector<std::unique_ptr<ReducerBucketState>> buckets_;
  WorkPool works_;            // each bucket's per-backward result Work
  std::mutex mu_;             // launch cursors, the flags of the bucket states, the first error
  int launch_cursor_ = 0;     // next bucket to launch (first stage)
  int allreduce_cursor_ = 0;  // hybrid: next bucket whose replica all-reduce to launch
  absl::Status first_error_;
  OpScheduler* scheduler_;          // ReducerConfig::scheduler, replaced by SetScheduler
  int contributors_ = 0;            // join's divide override (SetContributors); 0: none
  std::shared_ptr<CommHook> hook_;  // guarded; null: the default collectives
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_REDUCER_STAGES_H_
