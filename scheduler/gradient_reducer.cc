#include "scheduler/gradient_reducer.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/check.h"
#include "comm/logging.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"
#include "scheduler/plan_check.h"
#include "scheduler/reducer_marks.h"
#include "scheduler/reducer_stages.h"
#include "scheduler/reducer_storage.h"
#include "scheduler/user_calls.h"

namespace braid::sched {

absl::StatusOr<std::unique_ptr<GradientReducer>> GradientReducer::Create(
    std::vector<ParamSpec> params, ReducerGroups groups, const ReducerConfig& config) {
  if (groups.shard == nullptr) return absl::InvalidArgumentError("reducer: no group given");
  if (config.mode == ReduceMode::kHybrid && groups.replica == nullptr) {
    return absl::InvalidArgumentError(
        "reducer: hybrid mode needs a replica group (see braid_mesh_create)");
  }
  for (const ParamSpec& p : params) {
    if (!IsValidDType(static_cast<int>(p.dtype)) || !IsFloating(p.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", p.Label(), ": gradients must have a floating dtype, got ",
          IsValidDType(static_cast<int>(p.dtype)) ? DTypeName(p.dtype) : "an invalid one"));
    }
    const bool on_device = p.device.type != DeviceType::kCpu;
    for (Group* g : {groups.shard, config.mode == ReduceMode::kHybrid ? groups.replica : nullptr}) {
      if (g == nullptr) continue;
      const Capabilities c = g->capabilities();
      if (on_device ? !c.device_memory : !c.host_memory) {
        return absl::UnimplementedError(absl::StrCat(
            "parameter ", p.Label(), " is on ", p.device.ToString(), ": group '", g->name(),
            "' (backend ", g->backend_name(), ") does not reduce ",
            on_device ? "device buffers (they need the NCCL backend)" : "host buffers"));
      }
    }
  }
  RETURN_IF_ERROR(ReducerMarks::Check(params));
  // The storage options (shard_gradients, shared_pool), checked before anything collective.
  ASSIGN_OR_RETURN(std::unique_ptr<BucketStorage> storage, BucketStorage::Create(config, groups));
  if (config.reduce_dtype != DType::kBF16 && config.reduce_dtype != DType::kF16 &&
      config.reduce_dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce_dtype must be f32 (or bf16/f16: no staging), got ",
        IsValidDType(static_cast<int>(config.reduce_dtype)) ? DTypeName(config.reduce_dtype)
                                                            : "an invalid dtype"));
  }
  PlanOptions po;
  po.bucket_cap_bytes = config.bucket_cap_bytes;
  po.first_bucket_cap_bytes = config.first_bucket_cap_bytes;
  po.shards = config.mode == ReduceMode::kAllReduce ? 1 : groups.shard->size();
  ASSIGN_OR_RETURN(BucketPlan plan, BucketPlan::Build(std::move(params), po));
  RETURN_IF_ERROR(VerifyPlanAcrossRanks(plan, *groups.shard, config.timeout));
  if (groups.replica != nullptr && config.mode == ReduceMode::kHybrid) {
    RETURN_IF_ERROR(VerifyPlanAcrossRanks(plan, *groups.replica, config.timeout));
  }
  std::unique_ptr<GradientReducer> r(
      new GradientReducer(std::move(plan), groups, config, std::move(storage)));
  RETURN_IF_ERROR(r->storage_->Allocate(r->plan_));
  r->stages_->Reset(*r->storage_);
  // Device storage: zeroed before the framework writes into it from its own streams.
  RETURN_IF_ERROR(r->ops_.Synchronize(absl::Now() + config.timeout));
  return r;
}

GradientReducer::GradientReducer(BucketPlan plan, ReducerGroups groups, const ReducerConfig& config,
                                 std::unique_ptr<BucketStorage> storage)
    : plan_(std::move(plan)),
      groups_(groups),
      config_(config),
      marks_(std::make_unique<ReducerMarks>(plan_)),
      accumulated_(new std::atomic<uint8_t>[plan_.params().size()]),
      slot_taken_(new std::atomic<uint8_t>[plan_.params().size()]),
      external_(plan_.params().size(), nullptr),
      ops_(groups_.shard->buffer_ops()),
      storage_(std::move(storage)) {
  for (size_t i = 0; i < plan_.params().size(); ++i) {
    accumulated_[i].store(0);
    slot_taken_[i].store(0);
  }
  ReducerStages::Rows rows;
  if (config_.timeline != nullptr && config_.timeline->enabled()) {
    tl_ = config_.timeline;
    tl_marks_ = tl_->Track("marks");
    rows.launches = tl_->Track("bucket launches");
    rows.shard = tl_->Track(absl::StrCat("group ", groups_.shard->name()));
    if (groups_.replica != nullptr)
      rows.replica = tl_->Track(absl::StrCat("group ", groups_.replica->name()));
    tl_waits_ = tl_->Track("waits");
  }
  stages_ = std::make_unique<ReducerStages>(plan_, groups_, config_, external_, tl_, rows);
  used_ = std::make_unique<UsedMap>(plan_, groups_, config_);
  if (config_.rebuild_bucket_order) {
    ready_order_.reset(new int[plan_.params().size()]);
    rebuild_pending_ = true;
  }
}

GradientReducer::~GradientReducer() = default;

absl::StatusOr<TensorView> GradientReducer::GradView(ParamId id) const {
  ASSIGN_OR_RETURN(int i, plan_.IndexOf(id));
  return storage_->GradView(i);
}

absl::Status GradientReducer::SetScheduler(OpScheduler* scheduler) {
  if (in_backward_.load())
    return absl::FailedPreconditionError("setting the op scheduler during a backward");
  config_.scheduler = scheduler;
  stages_->SetScheduler(scheduler);
  return absl::OkStatus();
}

absl::Status GradientReducer::SetContributors(int contributors) {
  const int world =
      groups_.shard->size() * (config_.mode == ReduceMode::kHybrid ? groups_.replica->size() : 1);
  if (contributors < 0 || contributors > world) {
    return absl::InvalidArgumentError(
        absl::StrCat("join: ", contributors, " contributors: 0 or 1..", world, " ranks"));
  }
  if (in_backward_.load())
    return absl::FailedPreconditionError("join: setting the contributors during a backward");
  stages_->SetContributors(contributors);
  return absl::OkStatus();
}

absl::Status GradientReducer::SetGradBuffer(ParamId id, void* grad) {
  ASSIGN_OR_RETURN(int i, plan_.IndexOf(id));
  if (config_.gradient_as_bucket_view) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parameter ", plan_.params()[i].Label(),
        ": gradients are bucket views (gradient_as_bucket_view); write into braid_reducer_grad's "
        "buffer instead"));
  }
  if (grad == nullptr && plan_.params()[i].count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", plan_.params()[i].Label(), ": null buffer"));
  }
  if (in_backward_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter ", plan_.params()[i].Label(), ": during a backward"));
  }
  external_[i] = grad;
  return absl::OkStatus();
}

absl::Status GradientReducer::Pack(int i) {
  const ParamSpec& p = plan_.params()[i];
  const ParamSlot& s = plan_.slot(i);
  return ops_.Copy(storage_->Data(s.bucket) + s.offset * DTypeSize(p.dtype), external_[i],
                   p.count * DTypeSize(p.dtype));
}

TensorView GradientReducer::ShardView(int b) const {
  const Bucket& bk = plan_.buckets()[b];
  return TensorView{storage_->Result(b), bk.shard_count, bk.dtype, bk.device};
}

WorkPtr GradientReducer::BucketWork(int b) const { return stages_->work(b); }

absl::Status GradientReducer::BeginBackward(SyncMode mode) {
  if (mode == SyncMode::kReduceScatterOnly && config_.mode != ReduceMode::kHybrid) {
    return absl::InvalidArgumentError(
        "a reduce_scatter_only backward needs hybrid mode: it skips the replica all-reduce");
  }
  if (in_backward_.load()) {
    return absl::FailedPreconditionError(
        "the previous backward is not finished (call braid_reducer_finish_backward first)");
  }
  RETURN_IF_ERROR(stages_->NoneInFlight(kBeginBackward));  // an earlier backward's wait failed
  BufferOps& replica_ops =
      config_.mode == ReduceMode::kHybrid ? groups_.replica->buffer_ops() : ops_;
  if (mode == SyncMode::kReduceScatterOnly && !(ops_.can_add() && replica_ops.can_add())) {
    return absl::UnimplementedError(absl::StrCat(
        "a reduce_scatter_only backward: group '", groups_.shard->name(), "' (backend ",
        groups_.shard->backend_name(), ") cannot add partial shards in its memory"));
  }
  if (mode == SyncMode::kReduceScatterOnly && !ops_.synchronous()) {
    // The device add kernels take f32, bf16 and f16: refuse f64 here, not mid-window.
    for (size_t b = 0; b < plan_.buckets().size(); ++b) {
      if (plan_.buckets()[b].dtype == DType::kF64) {
        return absl::UnimplementedError(absl::StrCat(
            "a reduce_scatter_only backward: bucket ", b, " holds f64 gradients (first parameter ",
            plan_.params()[plan_.buckets()[b].params[0]].Label(),
            "), which the device cannot add"));
      }
    }
  }
  if (!config_.gradient_as_bucket_view) {
    if (mode == SyncMode::kReduceScatterOnly) {
      return absl::InvalidArgumentError(
          "a reduce_scatter_only backward needs gradients as bucket views: it zeroes the "
          "consumed gradients between microbatches, which it cannot do to the framework's buffers");
    }
    for (size_t i = 0; i < external_.size(); ++i) {
      if (external_[i] == nullptr && plan_.params()[i].count > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "parameter ", plan_.params()[i].Label(),
            " has no gradient buffer (copy-in path: call braid_reducer_set_grad_buffer for every "
            "parameter)"));
      }
    }
  }
  sync_ = mode;
  recording_.store(rebuild_pending_ && mode == SyncMode::kSync && ready_count_.load() == 0,
                   std::memory_order_relaxed);
  marks_->Begin();
  for (size_t i = 0; i < plan_.params().size(); ++i)
    slot_taken_[i].store(0, std::memory_order_relaxed);
  declared_.store(false, std::memory_order_relaxed);
  used_->Begin(mode);
  RETURN_IF_ERROR(stages_->Begin(mode, kBeginBackward));
  in_backward_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status GradientReducer::MarkReady(ParamId id, DeviceEvent ready) {
  return MarkReadyImpl(id, ready, nullptr, false);
}

absl::Status GradientReducer::MarkReady(ParamId id, DeviceEvent ready, const void* grad) {
  return MarkReadyImpl(id, ready, grad, true);
}

absl::StatusOr<TensorView> GradientReducer::GradSlot(ParamId id) {
  absl::StatusOr<int> i = plan_.IndexOf(id);
  if (!i.ok()) return absl::NotFoundError(absl::StrCat("unknown parameter id ", id));
  const ParamSpec& p = plan_.params()[*i];
  const auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("gradient slot of parameter ", p.Label(), ": ", why));
  };
  if (!in_backward_.load(std::memory_order_acquire)) {
    return refuse(absl::StrCat("outside a backward (call ", kBeginBackward, " first)"));
  }
  if (storage_->takes_bare_marks()) {
    return refuse(
        "the buckets are full-size gradient views (no shard_gradients): write into GradView");
  }
  if (marks_->expected(*i) != 1) {
    return refuse(
        "it is marked several times per backward (ParamSpec::marks): pass each contribution "
        "with its values (MarkReady(id, ready, grad))");
  }
  if (marks_->unused(*i)) return refuse("it was declared unused in this backward");
  if (marks_->count(*i) > 0 || accumulated_[*i].load(std::memory_order_relaxed)) {
    return refuse(
        "it already has a contribution in this accumulation window (no_sync): pass this one "
        "with its values (MarkReady(id, ready, grad)), which adds it");
  }
  const ParamSlot& slot = plan_.slot(*i);
  absl::Status st = storage_->Fill(slot.bucket);
  // Device: the framework writes from its own stream, after every earlier use of the storage.
  if (st.ok() && !ops_.synchronous()) st = ops_.Synchronize(absl::Now() + config_.timeout);
  if (!st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("gradient slot of parameter ", p.Label(), ": ", st.message()));
  }
  slot_taken_[*i].store(1, std::memory_order_release);
  return TensorView{storage_->Data(slot.bucket) + slot.offset * DTypeSize(p.dtype), p.count,
                    p.dtype, p.device};
}

absl::Status GradientReducer::MarkReadyImpl(ParamId id, DeviceEvent ready, const void* grad,
                                            bool with_values) {
  if (!in_backward_.load(std::memory_order_acquire)) {
    auto i = plan_.IndexOf(id);
    return absl::FailedPreconditionError(
        absl::StrCat("parameter ", i.ok() ? plan_.params()[*i].Label() : absl::StrCat("id ", id),
                     " marked ready outside a backward: call ", kBeginBackward, " first"));
  }
  absl::StatusOr<int> i = plan_.IndexOf(id);
  if (!i.ok()) return absl::NotFoundError(absl::StrCat("unknown parameter id ", id));
  const ParamSpec& p = plan_.params()[*i];
  // A values-less mark on pooled storage is the framework's write into GradSlot's slot: the
  // counted mark consumes the slot (a mark undone below hands it back).
  const bool slotted = slot_taken_[*i].load(std::memory_order_acquire) != 0;
  if (!with_values && !storage_->takes_bare_marks() && !slotted) {
    return storage_->BareMarkError(*i);
  }
  if (Declares(config_.agree_unused) && sync_ != SyncMode::kNoSync &&
      !declared_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter ", p.Label(),
                     " marked ready before braid_reducer_declare_unused: with agree_unused = ",
                     "declared, every rank declares its unused parameters (an empty list too) "
                     "before the first mark of each backward"));
  }
  if (with_values && !config_.gradient_as_bucket_view) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter ", p.Label(),
                     ": the copy-in path (gradient_as_bucket_view = false) packs the "
                     "braid_reducer_set_grad_buffer buffer; use braid_reducer_mark_ready"));
  }
  if (with_values && grad == nullptr && p.count > 0) {
    return absl::InvalidArgumentError(absl::StrCat("parameter ", p.Label(), ": null gradient"));
  }
  // Marks passing values: the copy (the window's first contribution) precedes the adds.
  std::unique_lock<std::mutex> values_lock;
  if (with_values) values_lock = std::unique_lock<std::mutex>(marks_->lock(*i));
  ASSIGN_OR_RETURN(const ReducerMarks::Mark mark,
                   marks_->Add(*i, /*launching=*/sync_ != SyncMode::kNoSync));
  if (slotted) slot_taken_[*i].store(0, std::memory_order_release);
  const auto undo = [&] {
    marks_->Undo(*i);
    if (slotted) slot_taken_[*i].store(1, std::memory_order_release);
  };
  if (tl_ != nullptr) tl_->Instant(tl_marks_, "mark", *i);
  if (with_values) {
    // Into the slot now: the first mark of the window copies (-0.0 survives), later ones add.
    const bool add = mark.index > 0 || accumulated_[*i].load(std::memory_order_relaxed);
    const ParamSlot& slot = plan_.slot(*i);
    const size_t es = DTypeSize(p.dtype);
    absl::Status st = storage_->Fill(slot.bucket);
    if (st.ok()) st = ops_.WaitFor(ready);
    if (st.ok() && p.count > 0) {
      char* dst = storage_->Data(slot.bucket) + slot.offset * es;
      st = add ? ops_.Add(dst, grad, dst, p.count, p.dtype) : ops_.Copy(dst, grad, p.count * es);
    }
    if (!st.ok()) {
      undo();
      return absl::Status(st.code(),
                          absl::StrCat("parameter ", p.Label(), ": ", add ? "adding" : "copying",
                                       " its gradient into its bucket: ", st.message()));
    }
    ready = {};  // waited for
    values_lock.unlock();
  }
  if (recording_.load(std::memory_order_relaxed) && mark.index == 0) {
    ready_order_[ready_count_.fetch_add(1)] = *i;
  }
  used_->NoteMarked(*i);
  if (sync_ == SyncMode::kNoSync) {
    // Nothing reads the gradient in this backward; the synced one that does waits for its own
    // events, and the framework orders its accumulation itself. Keep no reference.
    return absl::OkStatus();
  }
  if (!mark.completes) {
    // More contributions follow (or the count is not known yet: FinishBackward makes the
    // parameter ready). The comm stream waits for this one's producer now.
    absl::Status st = ops_.WaitFor(ready);
    if (!st.ok()) {
      undo();
      return absl::Status(st.code(), absl::StrCat("parameter ", p.Label(),
                                                  ": waiting for its event: ", st.message()));
    }
    return absl::OkStatus();
  }
  if (!config_.gradient_as_bucket_view) {
    // Copy-in: the pack reads the framework's buffer, so it waits for the producer.
    absl::Status st = ops_.WaitFor(ready);
    if (st.ok()) st = Pack(*i);
    if (!st.ok()) {
      undo();
      return absl::Status(st.code(), absl::StrCat("parameter ", plan_.params()[*i].Label(),
                                                  ": packing into its bucket: ", st.message()));
    }
  } else if (ready) {
    stages_->AddEvent(plan_.slot(*i).bucket, ready);
  }
  stages_->ParamReady(plan_.slot(*i).bucket);
  return absl::OkStatus();
}

absl::Status GradientReducer::WaitBucket(int bucket, absl::Time deadline) const {
  const int n = static_cast<int>(plan_.buckets().size());
  if (bucket < 0 || bucket >= n) {
    return absl::OutOfRangeError(absl::StrCat("bucket ", bucket, ": the reducer has ", n));
  }
  WorkPtr work = stages_->work(bucket);
  return work ? work->WaitUntil(deadline) : absl::OkStatus();
}

absl::Status GradientReducer::FinishBackward() {
  if (!in_backward_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("no backward in progress: call ", kBeginBackward, " first"));
  }
  const auto& params = plan_.params();
  if (sync_ == SyncMode::kNoSync) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (marks_->count(static_cast<int>(i)) > 0)
        accumulated_[i].store(1, std::memory_order_relaxed);
    }
    in_backward_.store(false, std::memory_order_release);
    return absl::OkStatus();
  }
  std::vector<int> unmarked;
  absl::Status count_error;  // a parameter marked fewer times than its count
  for (size_t n = 0; n < params.size(); ++n) {
    const int i = static_cast<int>(n);
    if (marks_->unused(i)) continue;  // declared unused: reduced as zeros already
    if (marks_->count(i) == 0) {
      unmarked.push_back(i);
      continue;
    }
    absl::StatusOr<ReducerMarks::Settled> settled = marks_->Settle(i);
    if (!settled.ok()) {
      count_error.Update(settled.status());
    } else if (*settled == ReducerMarks::Settled::kLearned) {
      // Counted now: ready (its contributions' events were waited for at their marks).
      if (!config_.gradient_as_bucket_view) {
        const absl::Status st = Pack(i);
        if (!st.ok()) {
          stages_->RecordError(
              absl::Status(st.code(), absl::StrCat("packing parameter ", params[i].Label(),
                                                   " into its bucket: ", st.message())));
        }
      }
      stages_->ParamReady(plan_.slot(i).bucket);
    }
  }
  absl::Status unused_error;
  if (Declares(config_.agree_unused) && !declared_.load()) {
    unused_error = absl::FailedPreconditionError(
        "the backward ends without braid_reducer_declare_unused: with agree_unused = declared, "
        "every rank "
        "declares its unused parameters (an empty list too) in every backward");
  } else if (!unmarked.empty() && !config_.allow_unused &&
             config_.agree_unused == UnusedAgreement::kNone) {
    std::vector<std::string> names;
    for (size_t k = 0; k < unmarked.size() && k < 10; ++k)
      names.push_back(params[unmarked[k]].Label());
    unused_error = absl::FailedPreconditionError(
        absl::StrCat(unmarked.size(), " parameter(s) were not marked ready in this backward: ",
                     absl::StrJoin(names, ", "), unmarked.size() > 10 ? ", ..." : "",
                     " (set allow_unused to zero-fill and reduce unused parameters)"));
  } else {
    for (int i : unmarked) ReduceUnmarked(i, "braid_reducer_finish_backward");
  }
  // Wait for everything launched (all buckets, unless parameters were missing).
  const int launched = stages_->launched();
  const absl::Time deadline = absl::Now() + config_.timeout;
  const int64_t wait_start = tl_ != nullptr ? Timeline::NowNs() : 0;
  absl::Status wait_error;
  for (int b = 0; b < launched; ++b) {
    absl::Status s = stages_->work(b)->WaitUntil(deadline);
    if (!s.ok() && wait_error.ok()) wait_error = s;
  }
  if (tl_ != nullptr)
    tl_->Complete(tl_waits_, "finish_backward wait", wait_start, Timeline::NowNs());
  for (size_t i = 0; i < plan_.params().size(); ++i)
    accumulated_[i].store(0, std::memory_order_relaxed);
  recording_.store(false, std::memory_order_relaxed);
  in_backward_.store(false, std::memory_order_release);
  absl::Status first_error = stages_->first_error();
  // The used-map agreement (agree_unused): issued or completed now that every bucket is done.
  const absl::Status used_error = used_->Finish(
      deadline, unused_error.ok() && count_error.ok() && first_error.ok() && wait_error.ok());
  if (!unused_error.ok()) return unused_error;
  if (!count_error.ok()) return count_error;
  if (!first_error.ok()) return first_error;
  if (!wait_error.ok()) return wait_error;
  return used_error;
}

void GradientReducer::ReduceUnmarked(int i, const char* caller) {
  // A parameter unused now but used in an earlier no_sync microbatch keeps that sum.
  const bool accumulated = accumulated_[i].load(std::memory_order_relaxed);
  const absl::Status st = accumulated && !config_.gradient_as_bucket_view
                              ? Pack(i)  // the framework's buffer holds the no_sync sum
                              : storage_->PrepareUnused(i, accumulated);
  if (!st.ok()) {
    stages_->RecordError(
        absl::Status(st.code(), absl::StrCat(caller, ": preparing unused parameter ",
                                             plan_.params()[i].Label(), ": ", st.message())));
  }
  marks_->SetUnused(i);
  stages_->ParamReady(plan_.slot(i).bucket);
}

absl::Status GradientReducer::ZeroGrads(DeviceEvent after) {
  RETURN_IF_ERROR(ops_.WaitFor(after));
  absl::Status first;
  for (size_t b = 0; b < plan_.buckets().size(); ++b) {
    first.Update(ZeroBucketQueued(static_cast<int>(b)));
  }
  first.Update(SyncZeroing());
  return first;
}

absl::Status GradientReducer::ZeroBucket(int b) {
  absl::Status st = ZeroBucketQueued(b);
  st.Update(SyncZeroing());
  return st;
}

absl::StatusOr<WorkPtr> GradientReducer::ZeroGradsAsync(DeviceEvent after) {
  RETURN_IF_ERROR(ops_.WaitFor(after));
  for (size_t b = 0; b < plan_.buckets().size(); ++b) {
    RETURN_IF_ERROR(ZeroBucketQueued(static_cast<int>(b)));
  }
  WorkPtr w = stages_->NewWork(WorkInfo{groups_.shard->name(), "zero_grads", 0, "every bucket"});
  if (ops_.synchronous()) {  // host memory: the zeroes are there now
    w->Complete(absl::OkStatus());
    return w;
  }
  // The device event is recorded on the comm stream after the memsets: the framework's stream
  // waits on it (cudaStreamWaitEvent) before writing into the gradient views; the reducer's own
  // operations need nothing (same stream). The Work keeps the event valid while it is held.
  RETURN_IF_ERROR(ops_.CompleteAfter(w, absl::Now() + config_.timeout));
  return w;
}

absl::Status GradientReducer::ZeroBucketQueued(int b) {
  // A reduction still running (its backward's wait failed) writes into the bucket afterwards.
  RETURN_IF_ERROR(stages_->BucketIdle(b, "zeroing gradients"));
  if (config_.gradient_as_bucket_view) {  // a new window: the next marks copy
    for (int i : plan_.buckets()[b].params) accumulated_[i].store(0, std::memory_order_relaxed);
  }
  // A bucket whose zeroing failed keeps its partial sum flag: nothing is silently dropped.
  RETURN_IF_ERROR(storage_->Zero(b));
  stages_->ClearPartial(b);
  return absl::OkStatus();
}

absl::Status GradientReducer::SyncZeroing() {
  // The reducer's own operations on a bucket are queued on the shard group's comm stream, after
  // the memset; the hybrid replica stream reads a shard only after the reduce-scatter's event.
  // Only a framework writing bucket views from its own streams needs a host wait here (without
  // an event to hand out; ZeroGradsAsync hands one out instead). See docs/design/reducer.md.
  if (ops_.synchronous() || !config_.gradient_as_bucket_view || !storage_->framework_writes()) {
    return absl::OkStatus();
  }
  return WithContext(ops_.Synchronize(absl::Now() + config_.timeout), "zeroing gradients");
}

}  // namespace braid::sched
