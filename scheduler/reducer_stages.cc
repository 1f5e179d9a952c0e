#include "scheduler/reducer_stages.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/logging.h"
#include "comm/status_macros.h"
#include "scheduler/divide.h"

namespace braid::sched {

ReducerStages::ReducerStages(const BucketPlan& plan, const ReducerGroups& groups,
                             const ReducerConfig& config, const std::vector<void*>& external,
                             Timeline* timeline, Rows rows)
    : plan_(plan),
      groups_(groups),
      config_(config),
      external_(external),
      ops_(groups_.shard->buffer_ops()),
      final_ops_(config_.mode == ReduceMode::kHybrid ? groups_.replica->buffer_ops() : ops_),
      tl_(timeline),
      rows_(rows),
      anchor_(new CallbackAnchor),
      scheduler_(config.scheduler) {
  anchor_->stages = this;
}

ReducerStages::~ReducerStages() {
  // Every reduction in flight (this backward's, or an earlier one's whose wait failed at its
  // deadline) may still write into its bucket: wait for it, then leak what still runs.
  const absl::Time deadline = absl::Now() + config_.timeout;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const int b = static_cast<int>(i);
    std::vector<WorkPtr> works;  // copied under the lock: a callback may launch stage 1
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!InFlightLocked(b)) continue;
      const ReducerBucketState& s = *buckets_[i];
      works = {s.stage[0].work, s.stage[1].work, s.work};
    }
    for (const WorkPtr& w : works) {
      if (w != nullptr) (void)w->WaitUntil(deadline);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!InFlightLocked(b)) continue;
    // A collective may still write into this bucket: leak it rather than free it under one.
    Log().error("gradient reducer destroyed with {} still in flight; leaking its storage",
                buckets_[i]->label);
    storage_->Abandon(b);
  }
  // Callbacks that come later find the anchor detached; wait for those already inside.
  // No bound: freeing the stages under a callback would be a use after free, and a callback's
  // own waits are bounded by their deadlines.
  anchor_->detached.store(true);
  const absl::Time warn = absl::Now() + config_.timeout;
  bool warned = false;
  while (anchor_->active.load() > 0) {
    if (!warned && absl::Now() > warn) {
      Log().warn("gradient reducer destruction waits for a completion callback still running");
      warned = true;
    }
    std::this_thread::yield();
  }
  CallbackAnchor::Release(anchor_);  // freed now, or by the last callback still to come
}

void ReducerStages::CallbackAnchor::Release(CallbackAnchor* anchor) {
  if (anchor->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete anchor;
}

void ReducerStages::Reset(BucketStorage& storage, bool layout_changed) {
  storage_ = &storage;
  buckets_.clear();
  if (hook_ && layout_changed) hook_->OnReplan(plan_.Fingerprint());  // its buckets moved
  for (size_t b = 0; b < plan_.buckets().size(); ++b) {
    auto s = std::make_unique<ReducerBucketState>();
    s->label = absl::StrCat("bucket ", b);
    s->events.reset(new DeviceEvent[plan_.buckets()[b].params.size()]);
    if (hook_) s->hook_label = absl::StrCat(s->label, " (comm hook '", hook_->name(), "')");
    buckets_.push_back(std::move(s));
  }
}

absl::Status ReducerStages::Begin(SyncMode mode, absl::string_view caller) {
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(NoneInFlightLocked(caller));
  sync_ = mode;
  launch_cursor_ = 0;
  allreduce_cursor_ = 0;
  first_error_ = absl::OkStatus();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    ReducerBucketState& s = *buckets_[b];
    s.pending.store(static_cast<int>(plan_.buckets()[b].params.size()), std::memory_order_relaxed);
    s.n_events.store(0, std::memory_order_relaxed);
    s.prepare_error = absl::OkStatus();
    s.ready = s.first_done = s.failed = false;
    s.stage[0].work.reset();
    s.stage[1].work.reset();
    s.handoff.reset();
    if (mode != SyncMode::kNoSync) {
      s.work = works_.Create(
          WorkInfo{groups_.shard->name(), "reduction", b, hook_ ? s.hook_label : s.label});
    }
  }
  return absl::OkStatus();
}

absl::Status ReducerStages::NoneInFlight(absl::string_view doing) {
  std::lock_guard<std::mutex> lock(mu_);
  return NoneInFlightLocked(doing);
}

absl::Status ReducerStages::BucketIdle(int b, absl::string_view doing) {
  std::lock_guard<std::mutex> lock(mu_);
  return InFlightLocked(b) ? InFlightError(b, doing) : absl::OkStatus();
}

absl::Status ReducerStages::NoneInFlightLocked(absl::string_view doing) const {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (InFlightLocked(static_cast<int>(b))) return InFlightError(static_cast<int>(b), doing);
  }
  return absl::OkStatus();
}

absl::Status ReducerStages::InFlightError(int b, absl::string_view doing) const {
  return absl::FailedPreconditionError(absl::StrCat(
      doing, ": ", buckets_[b]->label,
      "'s reduction from an earlier backward is still in flight (that backward's wait ended "
      "at its deadline); its storage cannot be reused until the reduction completes: retry "
      "later, or destroy the reducer"));
}

bool ReducerStages::InFlightLocked(int b) const {
  const ReducerBucketState& s = *buckets_[b];
  for (const ReducerBucketState::Stage& st : s.stage) {
    if (st.work != nullptr && !st.work->Done()) return true;
  }
  // Launched, and its result not final yet: a callback still to run, or a replica all-reduce
  // waiting for an earlier bucket's.
  return s.stage[0].work != nullptr && s.work != nullptr && !s.work->Done();
}

void ReducerStages::AddEvent(int b, DeviceEvent ready) {
  ReducerBucketState& s = *buckets_[b];
  s.events[s.n_events.fetch_add(1, std::memory_order_relaxed)] = ready;
}

void ReducerStages::ParamReady(int bucket) {
  ReducerBucketState& s = *buckets_[bucket];
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  absl::StatusOr<char*> staging = storage_->TakeStaging(bucket);
  if (!staging.ok() || *staging != nullptr) {  // complete: widen it now, outside the launch lock
    const Bucket& bk = plan_.buckets()[bucket];
    absl::Status st = staging.status();
    const int n = s.n_events.load(std::memory_order_relaxed);  // after pending's acq_rel
    for (int k = 0; k < n && st.ok(); ++k) st = ops_.WaitFor(s.events[k]);
    if (st.ok()) {
      st = ops_.CastScale(storage_->Data(bucket), bk.dtype, *staging, DType::kF32, bk.padded_count,
                          ScaleSpec{});
    }
    s.n_events.store(0, std::memory_order_relaxed);  // waited for: the launch needs none
    if (!st.ok()) {
      s.prepare_error = absl::Status(
          st.code(), absl::StrCat(s.label, ": widening to f32 for the reduction: ", st.message()));
    }
  }
  int first, last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.ready = true;
    first = launch_cursor_;
    while (launch_cursor_ < static_cast<int>(buckets_.size()) && buckets_[launch_cursor_]->ready) {
      LaunchStageLocked(launch_cursor_++, 0);
    }
    last = launch_cursor_;
  }
  Watch(first, last, 0);
}

int ReducerStages::launched() {
  std::lock_guard<std::mutex> lock(mu_);
  return launch_cursor_;
}

WorkPtr ReducerStages::work(int b) const { return buckets_[b]->work; }

absl::Status ReducerStages::first_error() {
  std::lock_guard<std::mutex> lock(mu_);
  return first_error_;
}

void ReducerStages::RecordError(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_error_.ok()) first_error_ = s;
}

int ReducerStages::FirstPartial() const {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b]->has_partial) return static_cast<int>(b);
  }
  return -1;
}

void ReducerStages::SetCommHook(std::shared_ptr<CommHook> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hook_ = std::move(hook);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b]->hook_label =
        hook_ ? absl::StrCat(buckets_[b]->label, " (comm hook '", hook_->name(), "')") : "";
  }
}

void ReducerStages::SetScheduler(OpScheduler* scheduler) {
  std::lock_guard<std::mutex> lock(mu_);
  scheduler_ = scheduler;
}

void ReducerStages::SetContributors(int contributors) {
  std::lock_guard<std::mutex> lock(mu_);
  contributors_ = contributors;
}

void ReducerStages::LaunchStageLocked(int b, int stage) {
  const Bucket& bk = plan_.buckets()[b];
  ReducerBucketState& s = *buckets_[b];
  CollectiveOptions opts;
  opts.label = s.label;
  if (stage == 0) {         // the group's stream waits for every producer of the bucket
    storage_->Launched(b);  // its storage comes back on its own now (a bounded pool waits)
    opts.ready_events =
        absl::MakeConstSpan(s.events.get(), s.n_events.load(std::memory_order_relaxed));
  }
  Group& g = stage == 0 ? *groups_.shard : *groups_.replica;
  const DType t = storage_->CommDType(b);
  const ReduceStep step =
      contributors_ > 0 ? StepForContributors(contributors_, stage) : StepFor(t, g.size());
  ReductionRequest req{
      &g, CollectiveKind::kAllReduce, nullptr, nullptr, bk.shard_count, t, step.op, opts, b};
  if (stage == 1) {
    req.send = req.recv = storage_->ReplicaBuffer(b);
  } else if (config_.mode == ReduceMode::kAllReduce) {
    req.send = req.recv = storage_->CommData(b);
    req.count = bk.count;
  } else {
    req.kind = CollectiveKind::kReduceScatter;
    req.send = storage_->CommData(b);
    req.recv = ShardRecv(b);
  }
  ReducerBucketState::Stage& rec = s.stage[stage];
  const bool prepared = stage == 1 || s.prepare_error.ok();
  rec.hook =
      prepared && hook_ != nullptr &&
              hook_->Handles(stage == 1                               ? CommStage::kReplicaAllReduce
                             : req.kind == CollectiveKind::kAllReduce ? CommStage::kAllReduce
                                                                      : CommStage::kReduceScatter)
          ? hook_
          : nullptr;
  absl::StatusOr<WorkPtr> w =
      !prepared               ? absl::StatusOr<WorkPtr>(s.prepare_error)
      : rec.hook != nullptr   ? RunHookLocked(b, stage, req)  // the hook averages
      : scheduler_ != nullptr ? scheduler_->SubmitReduction(req)
      : req.kind == CollectiveKind::kAllReduce
          ? g.AllReduce(req.send, req.recv, req.count, t, step.op, opts)
          : g.ReduceScatter(req.send, req.recv, req.count, t, step.op, opts);
  rec.work = w.ok() ? *std::move(w)
                    : Work::Completed(WorkInfo{g.name(), "launch", 0, s.label}, w.status());
  rec.post_divide = w.ok() && rec.hook == nullptr ? step.post_divide : 1;
  if (tl_ != nullptr) {
    rec.start_ns = Timeline::NowNs();
    if (stage == 0) tl_->Instant(rows_.launches, "launch", b);
  }
}

char* ReducerStages::ShardRecv(int b) const {
  const bool final = config_.mode == ReduceMode::kReduceScatter &&
                     storage_->CommDType(b) == plan_.buckets()[b].dtype;
  return final ? storage_->Result(b) : storage_->CommShard(b);
}

void ReducerStages::Watch(int first, int last, int stage) {
  for (int b = first; b < last; ++b) {
    const WorkPtr& w = buckets_[b]->stage[stage].work;
    if (w == nullptr) continue;  // hybrid: a bucket whose reduce-scatter failed
    // [anchor, b, stage] fits std::function's inline buffer: no allocation per launch.
    anchor_->refs.fetch_add(1, std::memory_order_relaxed);
    w->OnComplete([anchor = anchor_, b, stage](const absl::Status& st) {
      anchor->active.fetch_add(1);  // before reading detached: the destructor waits for it
      if (!anchor->detached.load()) anchor->stages->OnStageDone(b, stage, st);
      anchor->active.fetch_sub(1);
      CallbackAnchor::Release(anchor);
    });
  }
}

void ReducerStages::OnStageDone(int b, int stage, const absl::Status& collective) {
  ReducerBucketState& s = *buckets_[b];
  const ReducerBucketState::Stage& rec = s.stage[stage];
  // A hook's result goes into the stage's buffer first: then the pipeline runs as after the
  // default collective (its errors, named with the hook, count as the collective's).
  const absl::Status done = rec.hook != nullptr ? DeliverHook(b, stage, collective) : collective;
  if (tl_ != nullptr) {
    const char* name = stage == 1                               ? "allreduce (replicas)"
                       : config_.mode == ReduceMode::kAllReduce ? "allreduce"
                                                                : "reduce_scatter";
    tl_->Complete(stage == 1 ? rows_.replica : rows_.shard, name, rec.start_ns, Timeline::NowNs(),
                  b);
  }
  if (stage == 1) {
    OnReplicaStageDone(b, done);
    return;
  }
  const Bucket& bk = plan_.buckets()[b];
  const bool whole = config_.mode == ReduceMode::kAllReduce;
  const bool hybrid = config_.mode == ReduceMode::kHybrid;
  const DType t = storage_->CommDType(b);
  const size_t n = whole ? bk.count : bk.shard_count;
  // A synced hybrid bucket feeds its replica all-reduce. Where its memory operations run
  // (BucketStorage::handoff): ahead of that all-reduce on the replica group (ordered after the
  // reduce-scatter's completion event), or on the shard group with an event handed over.
  const bool feeds_replicas = hybrid && sync_ != SyncMode::kReduceScatterOnly;
  const bool on_replica =
      feeds_replicas && storage_->handoff() == BucketStorage::Handoff::kOnReplicaStream;
  BufferOps& ops = on_replica ? final_ops_ : ops_;
  char* comm = whole ? storage_->CommData(b) : ShardRecv(b);
  absl::Status st = done;
  if (st.ok() && on_replica) st = ops.WaitFor(rec.work->device_event());
  if (st.ok() && rec.post_divide > 1) {  // f16: the divide after the sum
    st = ops.CastScale(comm, t, comm, t, n, ScaleSpec{false, 1.0, rec.post_divide});
  }
  if (!hybrid) {  // the last stage: the result to its place, rounded once to the gradient dtype
    char* result = whole ? storage_->Data(b) : storage_->Result(b);
    if (st.ok() && comm != result) {
      st = t == bk.dtype ? ops.Copy(result, comm, n * DTypeSize(t))
                         : ops.CastScale(comm, t, result, bk.dtype, n, ScaleSpec{});
    }
    if (st.ok() && !config_.gradient_as_bucket_view && whole) st = Unpack(b);
    // Issued after every use of the storage on this stream; a failed bucket keeps it (the
    // collective may not have let go of it) until ZeroBucket / ZeroGrads.
    if (st.ok()) storage_->Release(b);
    FinishBucket(b, OpError(b, done, st), ops);
    return;
  }
  if (sync_ == SyncMode::kReduceScatterOnly) {
    // Into the window's partial sum (the first microbatch copies: a copy keeps -0.0), and the
    // microbatch's gradients are consumed.
    absl::StatusOr<char*> partial = st.ok() ? storage_->Partial(b) : st;
    st = partial.status();
    if (st.ok()) {
      st = s.has_partial ? ops.Add(*partial, comm, *partial, n, t)
                         : ops.Copy(*partial, comm, n * DTypeSize(t));
    }
    if (st.ok()) {
      s.has_partial = true;
      st = storage_->Consume(b, ops);
    }
    FinishBucket(b, OpError(b, done, st), ops);
    return;
  }
  // Synced hybrid: partial + shard (or the shard) into the buffer the replicas all-reduce.
  char* dst = storage_->ReplicaBuffer(b);
  if (st.ok() && s.has_partial) {
    absl::StatusOr<char*> partial = storage_->Partial(b);
    st = partial.ok() ? ops.Add(*partial, comm, dst, n, t) : partial.status();
  } else if (st.ok() && dst != comm) {
    st = ops.Copy(dst, comm, n * DTypeSize(t));
  }
  if (st.ok()) {
    s.has_partial = false;
    storage_->Release(b);
  }
  if (st.ok() && !on_replica && !ops_.synchronous()) {  // the replica stream waits for the copy
    s.handoff = works_.Create(
        WorkInfo{groups_.shard->name(), "shard handoff", static_cast<uint64_t>(b), s.label});
    st = ops_.CompleteAfter(s.handoff, absl::Now() + config_.timeout);
    if (st.ok()) st = final_ops_.WaitFor(s.handoff->device_event());
  }
  st = OpError(b, done, st);
  LaunchReplicaStages(b, st);
  if (!st.ok()) FinishBucket(b, st, ops);  // last: a completed Work means its callbacks ran
}

void ReducerStages::OnReplicaStageDone(int b, const absl::Status& done) {
  // The replica all-reduce ran in place on ReplicaBuffer(b), in the reduction dtype.
  const Bucket& bk = plan_.buckets()[b];
  const int post_divide = buckets_[b]->stage[1].post_divide;
  const DType t = storage_->CommDType(b);
  char* buf = storage_->ReplicaBuffer(b);
  absl::Status st = done;
  if (st.ok() && post_divide > 1) {
    st = final_ops_.CastScale(buf, t, buf, t, bk.shard_count, ScaleSpec{false, 1.0, post_divide});
  }
  if (st.ok() && t != bk.dtype) {  // round once, to the gradient dtype
    st = final_ops_.CastScale(buf, t, storage_->Result(b), bk.dtype, bk.shard_count, ScaleSpec{});
  }
  FinishBucket(b, OpError(b, done, st), final_ops_);
}

void ReducerStages::LaunchReplicaStages(int b, const absl::Status& st) {
  // All-reduce it across replicas, in bucket order (a failed bucket is skipped: its error
  // already ends this backward).
  int first, last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    buckets_[b]->first_done = true;
    buckets_[b]->failed = !st.ok();
    first = allreduce_cursor_;
    while (allreduce_cursor_ < static_cast<int>(buckets_.size()) &&
           buckets_[allreduce_cursor_]->first_done) {
      const int k = allreduce_cursor_++;
      if (!buckets_[k]->failed) LaunchStageLocked(k, 1);
    }
    last = allreduce_cursor_;
  }
  Watch(first, last, 1);
}

absl::Status ReducerStages::Unpack(int b) {
  for (int i : plan_.buckets()[b].params) {
    const ParamSpec& p = plan_.params()[i];
    absl::Status st =
        ops_.Copy(external_[i], storage_->Data(b) + plan_.slot(i).offset * DTypeSize(p.dtype),
                  p.count * DTypeSize(p.dtype));
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

void ReducerStages::FinishBucket(int b, absl::Status s, BufferOps& ops) {
  WorkPtr w = buckets_[b]->work;  // keeps the Work alive while its callbacks run
  storage_->Settled(b);           // a failed bucket keeps its storage: not coming back
  if (s.ok() && !ops.synchronous()) {
    // Device: the bucket's result is final once the operations queued after the collective
    // have run; the Work completes then (and exposes that point as its device event).
    s = ops.CompleteAfter(w, absl::Now() + config_.timeout);
    if (s.ok()) return;
    s = OpError(b, absl::OkStatus(), s);
  }
  if (!s.ok()) RecordError(s);
  w->Complete(std::move(s));
}

absl::Status ReducerStages::OpError(int b, const absl::Status& collective,
                                    const absl::Status& st) const {
  if (st.ok() || !collective.ok()) return st;  // a collective's error names itself
  return absl::Status(st.code(), absl::StrCat(buckets_[b]->label, " on group '",
                                              groups_.shard->name(), "': ", st.message()));
}

}  // namespace braid::sched
