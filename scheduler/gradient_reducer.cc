#include "scheduler/gradient_reducer.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/check.h"
#include "comm/logging.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"
#include "scheduler/plan_check.h"
#include "scheduler/reducer_bucket_state.h"

namespace braid::sched {

absl::StatusOr<std::unique_ptr<GradientReducer>> GradientReducer::Create(
    std::vector<ParamSpec> params, ReducerGroups groups, const ReducerConfig& config) {
  if (groups.shard == nullptr) return absl::InvalidArgumentError("reducer: no group given");
  if (config.mode == ReduceMode::kHybrid && groups.replica == nullptr) {
    return absl::InvalidArgumentError("reducer: hybrid mode needs a replica group (see MakeMesh)");
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
  if (config.keep_shards_only) {
    if (config.mode == ReduceMode::kAllReduce) {
      return absl::InvalidArgumentError(
          "keep_shards_only needs reduce-scatter or hybrid mode: all-reduce keeps whole gradients");
    }
    if (!config.gradient_as_bucket_view) {
      return absl::InvalidArgumentError(
          "keep_shards_only passes gradients at MarkReady(id, ready, grad): it does not use the "
          "copy-in path (gradient_as_bucket_view = false)");
    }
    if (config.rebuild_bucket_order) {
      return absl::InvalidArgumentError(
          "keep_shards_only does not rebuild the bucket order (rebuild_bucket_order): buckets "
          "hold no full-size storage between backwards to move gradients through");
    }
  }
  if (config.shared_pool != nullptr && (!config.keep_shards_only || groups.shard == nullptr ||
                                        !groups.shard->buffer_ops().synchronous())) {
    return absl::InvalidArgumentError(
        "shared_pool is for keep_shards_only reducers on host groups (device groups queue their "
        "operations on different streams)");
  }
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
  std::unique_ptr<GradientReducer> r(new GradientReducer(std::move(plan), groups, config));
  RETURN_IF_ERROR(r->AllocateBuckets());
  return r;
}

GradientReducer::GradientReducer(BucketPlan plan, ReducerGroups groups, const ReducerConfig& config)
    : plan_(std::move(plan)),
      groups_(groups),
      config_(config),
      marked_(new std::atomic<uint8_t>[plan_.params().size()]),
      accumulated_(new std::atomic<uint8_t>[plan_.params().size()]),
      external_(plan_.params().size(), nullptr),
      ops_(groups_.shard->buffer_ops()),
      final_ops_(config_.mode == ReduceMode::kHybrid ? groups_.replica->buffer_ops() : ops_) {
  for (size_t i = 0; i < plan_.params().size(); ++i) {
    marked_[i].store(0);
    accumulated_[i].store(0);
  }
  if (config_.timeline != nullptr && config_.timeline->enabled()) {
    tl_ = config_.timeline;
    tl_marks_ = tl_->Track("marks");
    tl_launches_ = tl_->Track("bucket launches");
    tl_first_ = tl_->Track(absl::StrCat("group ", groups_.shard->name()));
    if (groups_.replica != nullptr)
      tl_replica_ = tl_->Track(absl::StrCat("group ", groups_.replica->name()));
    tl_waits_ = tl_->Track("waits");
  }
  if (config_.rebuild_bucket_order) {
    ready_order_.reset(new int[plan_.params().size()]);
    rebuild_pending_ = true;
  }
}

absl::Status GradientReducer::AllocateBuckets() {
  buckets_.clear();
  for (size_t b = 0; b < plan_.buckets().size(); ++b) {
    auto s = std::make_unique<BucketState>();
    s->label = absl::StrCat("bucket ", b);
    const Bucket& bk = plan_.buckets()[b];
    s->events.reset(new DeviceEvent[bk.params.size()]);
    if (config_.keep_shards_only) {
      const size_t kept = bk.shard_count * DTypeSize(bk.dtype);
      ASSIGN_OR_RETURN(s->kept, CountedAllocate(config_.memory, ops_, kept, MemoryUse::kGradShards,
                                                absl::StrCat(s->label, " (kept shard)")));
      RETURN_IF_ERROR(ops_.Zero(s->kept.get(), kept));
      if (config_.mode == ReduceMode::kHybrid && config_.reduce_dtype == DType::kF32 &&
          IsHalf(bk.dtype)) {
        ASSIGN_OR_RETURN(
            s->reduced,
            CountedAllocate(config_.memory, ops_, bk.shard_count * DTypeSize(DType::kF32),
                            MemoryUse::kGradShards, absl::StrCat(s->label, " (f32 shard)")));
      }
      buckets_.push_back(std::move(s));
      continue;
    }
    const size_t bytes = (bk.bytes() + kStorageAlign - 1) / kStorageAlign * kStorageAlign;
    ASSIGN_OR_RETURN(
        s->data, CountedAllocate(config_.memory, ops_, bytes, MemoryUse::kGradBuckets, s->label));
    RETURN_IF_ERROR(ops_.Zero(s->data.get(), bytes));
    if (config_.reduce_dtype == DType::kF32 && IsHalf(plan_.buckets()[b].dtype)) {
      ASSIGN_OR_RETURN(
          s->staging,
          CountedAllocate(config_.memory, ops_,
                          plan_.buckets()[b].padded_count * DTypeSize(DType::kF32),
                          MemoryUse::kStaging, absl::StrCat(s->label, " (f32 staging)")));
    }
    buckets_.push_back(std::move(s));
  }
  if (config_.keep_shards_only) {
    if (pool_ == nullptr)
      pool_ = config_.shared_pool ? config_.shared_pool : std::make_shared<BufferPool>();
    pool_->Reserve(2 * buckets_.size());
  }
  // Device storage: zeroed before the framework writes into it from its own streams.
  return ops_.Synchronize(absl::Now() + config_.timeout);
}

GradientReducer::~GradientReducer() {
  int launched;
  {
    std::lock_guard<std::mutex> lock(mu_);
    launched = launch_cursor_;
  }
  for (int i = 0; i < launched; ++i) {  // buckets never launched have nothing in flight
    auto& b = buckets_[i];
    if (b->work == nullptr || b->work->Done()) continue;
    if (!b->work->Wait(config_.timeout).ok() && !b->work->Done()) {
      // A collective may still write into this bucket: leak it rather than free it under one.
      Log().error("gradient reducer destroyed with {} still in flight; leaking its storage",
                  b->label);
      (void)b->data.release();
      (void)b->staging.release();
      (void)b->partial.release();
      (void)b->kept.release();
      (void)b->reduced.release();
      if (pool_ != nullptr) pool_->Abandon();  // storage given back while still in use
    }
  }
}

char* GradientReducer::BucketData(int b) const { return buckets_[b]->data.get(); }

char* GradientReducer::ShardData(int b) const {
  if (config_.keep_shards_only) return buckets_[b]->kept.get();
  return StorageShard(b);
}

char* GradientReducer::CommKept(int b) const {
  return buckets_[b]->reduced ? buckets_[b]->reduced.get() : buckets_[b]->kept.get();
}

char* GradientReducer::StorageShard(int b) const {
  const Bucket& bk = plan_.buckets()[b];
  const int shard_rank = config_.mode == ReduceMode::kAllReduce ? 0 : groups_.shard->rank();
  return BucketData(b) + static_cast<size_t>(shard_rank) * bk.shard_count * DTypeSize(bk.dtype);
}

DType GradientReducer::CommDType(int b) const {
  // The staging rule (with keep_shards_only the staging buffer is only held while reducing).
  const DType t = plan_.buckets()[b].dtype;
  return config_.reduce_dtype == DType::kF32 && IsHalf(t) ? DType::kF32 : t;
}

char* GradientReducer::CommData(int b) const {
  return buckets_[b]->staging ? buckets_[b]->staging.get() : BucketData(b);
}

char* GradientReducer::CommShard(int b) const {
  if (!buckets_[b]->staging) return StorageShard(b);
  const int shard_rank = config_.mode == ReduceMode::kAllReduce ? 0 : groups_.shard->rank();
  return CommData(b) +
         static_cast<size_t>(shard_rank) * plan_.buckets()[b].shard_count * DTypeSize(DType::kF32);
}

absl::StatusOr<TensorView> GradientReducer::GradView(ParamId id) const {
  ASSIGN_OR_RETURN(int i, plan_.IndexOf(id));
  const ParamSpec& p = plan_.params()[i];
  if (config_.keep_shards_only) {
    return absl::FailedPreconditionError(
        absl::StrCat("GradView(", p.Label(),
                     "): with keep_shards_only gradients are passed at "
                     "MarkReady(id, ready, grad); buckets hold no storage between backwards"));
  }
  const ParamSlot& s = plan_.slot(i);
  return TensorView{BucketData(s.bucket) + s.offset * DTypeSize(p.dtype), p.count, p.dtype,
                    p.device};
}

absl::Status GradientReducer::SetScheduler(OpScheduler* scheduler) {
  if (in_backward_.load()) return absl::FailedPreconditionError("SetScheduler during a backward");
  std::lock_guard<std::mutex> lock(mu_);
  config_.scheduler = scheduler;
  return absl::OkStatus();
}

absl::Status GradientReducer::SetGradBuffer(ParamId id, void* grad) {
  ASSIGN_OR_RETURN(int i, plan_.IndexOf(id));
  if (config_.gradient_as_bucket_view) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SetGradBuffer(", plan_.params()[i].Label(),
        "): gradients are bucket views (gradient_as_bucket_view); use GradView instead"));
  }
  if (grad == nullptr && plan_.params()[i].count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetGradBuffer(", plan_.params()[i].Label(), "): null buffer"));
  }
  if (in_backward_.load()) {
    return absl::FailedPreconditionError(
        absl::StrCat("SetGradBuffer(", plan_.params()[i].Label(), ") during a backward"));
  }
  external_[i] = grad;
  return absl::OkStatus();
}

absl::Status GradientReducer::Pack(int i) {
  const ParamSpec& p = plan_.params()[i];
  const ParamSlot& s = plan_.slot(i);
  return ops_.Copy(BucketData(s.bucket) + s.offset * DTypeSize(p.dtype), external_[i],
                   p.count * DTypeSize(p.dtype));
}

absl::Status GradientReducer::Unpack(int b) {
  for (int i : plan_.buckets()[b].params) {
    const ParamSpec& p = plan_.params()[i];
    RETURN_IF_ERROR(ops_.Copy(external_[i],
                              BucketData(b) + plan_.slot(i).offset * DTypeSize(p.dtype),
                              p.count * DTypeSize(p.dtype)));
  }
  return absl::OkStatus();
}

TensorView GradientReducer::ShardView(int b) const {
  const Bucket& bk = plan_.buckets()[b];
  return TensorView{ShardData(b), bk.shard_count, bk.dtype, bk.device};
}

WorkPtr GradientReducer::BucketWork(int b) const { return buckets_[b]->work; }

absl::Status GradientReducer::BeginBackward(SyncMode mode) {
  if (mode == SyncMode::kReduceScatterOnly && config_.mode != ReduceMode::kHybrid) {
    return absl::InvalidArgumentError(
        "BeginBackward(reduce_scatter_only) needs hybrid mode: it skips the replica all-reduce");
  }
  if (in_backward_.load()) {
    return absl::FailedPreconditionError(
        "BeginBackward: the previous backward is not finished (call FinishBackward first)");
  }
  if (mode == SyncMode::kReduceScatterOnly && !(ops_.can_add() && final_ops_.can_add())) {
    return absl::UnimplementedError(absl::StrCat(
        "BeginBackward(reduce_scatter_only): group '", groups_.shard->name(), "' (backend ",
        groups_.shard->backend_name(), ") cannot add partial shards in its memory"));
  }
  if (mode == SyncMode::kReduceScatterOnly && !ops_.synchronous()) {
    // The device add kernels take f32, bf16 and f16: refuse f64 here, not mid-window.
    for (size_t b = 0; b < plan_.buckets().size(); ++b) {
      if (plan_.buckets()[b].dtype == DType::kF64) {
        return absl::UnimplementedError(
            absl::StrCat("BeginBackward(reduce_scatter_only): bucket ", b,
                         " holds f64 gradients (first parameter ",
                         plan_.params()[plan_.buckets()[b].params[0]].Label(),
                         "), which the device cannot add"));
      }
    }
  }
  if (!config_.gradient_as_bucket_view) {
    if (mode == SyncMode::kReduceScatterOnly) {
      return absl::InvalidArgumentError(
          "BeginBackward(reduce_scatter_only) needs gradients as bucket views: it zeroes the "
          "consumed gradients between microbatches, which it cannot do to the framework's buffers");
    }
    for (size_t i = 0; i < external_.size(); ++i) {
      if (external_[i] == nullptr && plan_.params()[i].count > 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "BeginBackward: parameter ", plan_.params()[i].Label(),
            " has no gradient buffer (copy-in path: call SetGradBuffer for every parameter)"));
      }
    }
  }
  sync_ = mode;
  recording_.store(rebuild_pending_ && mode == SyncMode::kSync && ready_count_.load() == 0,
                   std::memory_order_relaxed);
  for (size_t i = 0; i < plan_.params().size(); ++i) marked_[i].store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    launch_cursor_ = 0;
    allreduce_cursor_ = 0;
    first_error_ = absl::OkStatus();
    for (size_t b = 0; b < buckets_.size(); ++b) {
      BucketState& s = *buckets_[b];
      s.pending.store(static_cast<int>(plan_.buckets()[b].params.size()),
                      std::memory_order_relaxed);
      s.n_events.store(0, std::memory_order_relaxed);
      s.prepare_error = absl::OkStatus();
      s.ready = s.first_done = s.failed = false;
      s.stage[0].work.reset();
      s.stage[1].work.reset();
      s.handoff.reset();
      if (mode != SyncMode::kNoSync) {
        s.work = works_.Create(WorkInfo{groups_.shard->name(), "reduction", b, s.label});
      }
    }
  }
  in_backward_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status GradientReducer::MarkReady(ParamId id, DeviceEvent ready) {
  return MarkReadyImpl(id, ready, nullptr, false);
}

absl::Status GradientReducer::MarkReady(ParamId id, DeviceEvent ready, const void* grad) {
  return MarkReadyImpl(id, ready, grad, true);
}

absl::Status GradientReducer::MarkReadyImpl(ParamId id, DeviceEvent ready, const void* grad,
                                            bool with_values) {
  if (!in_backward_.load(std::memory_order_acquire)) {
    auto i = plan_.IndexOf(id);
    return absl::FailedPreconditionError(
        absl::StrCat("MarkReady(", i.ok() ? plan_.params()[*i].Label() : absl::StrCat("id ", id),
                     ") outside a backward: call BeginBackward first"));
  }
  absl::StatusOr<int> i = plan_.IndexOf(id);
  if (!i.ok()) return absl::NotFoundError(absl::StrCat("MarkReady: unknown parameter id ", id));
  const ParamSpec& p = plan_.params()[*i];
  if (!with_values && config_.keep_shards_only) {
    return absl::FailedPreconditionError(
        absl::StrCat("MarkReady(", p.Label(),
                     ") without its gradient: with keep_shards_only pass it, "
                     "MarkReady(id, ready, grad)"));
  }
  if (with_values && !config_.gradient_as_bucket_view) {
    return absl::FailedPreconditionError(
        absl::StrCat("MarkReady(", p.Label(),
                     ", grad): the copy-in path (gradient_as_bucket_view = false) "
                     "packs the SetGradBuffer buffer; use MarkReady(id, ready)"));
  }
  if (with_values && grad == nullptr && p.count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MarkReady(", p.Label(), ", grad): null gradient"));
  }
  if (marked_[*i].exchange(1, std::memory_order_acq_rel) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("MarkReady: parameter ", plan_.params()[*i].Label(),
                     " was already marked ready in this backward"));
  }
  if (tl_ != nullptr) tl_->Instant(tl_marks_, "mark", *i);
  if (with_values) {
    // Into the slot now: the first mark of the window copies (-0.0 survives), later ones add.
    const ParamSlot& slot = plan_.slot(*i);
    const size_t es = DTypeSize(p.dtype);
    absl::Status st = config_.keep_shards_only ? AcquireStorage(slot.bucket) : absl::OkStatus();
    if (st.ok()) st = ops_.WaitFor(ready);
    if (st.ok() && p.count > 0) {
      char* dst = BucketData(slot.bucket) + slot.offset * es;
      st = accumulated_[*i].load(std::memory_order_relaxed)
               ? ops_.Add(dst, grad, dst, p.count, p.dtype)
               : ops_.Copy(dst, grad, p.count * es);
    }
    if (!st.ok()) {
      marked_[*i].store(0, std::memory_order_release);
      return absl::Status(
          st.code(),
          absl::StrCat("MarkReady(", p.Label(), "): ",
                       accumulated_[*i].load(std::memory_order_relaxed) ? "adding" : "copying",
                       " its gradient into its bucket: ", st.message()));
    }
    ready = {};  // waited for
  }
  if (recording_.load(std::memory_order_relaxed)) ready_order_[ready_count_.fetch_add(1)] = *i;
  if (sync_ == SyncMode::kNoSync) {
    // Nothing reads the gradient in this backward; the synced one that does waits for its own
    // events, and the framework orders its accumulation itself. Keep no reference.
    return absl::OkStatus();
  }
  if (!config_.gradient_as_bucket_view) {
    // Copy-in: the pack reads the framework's buffer, so it waits for the producer.
    absl::Status st = ops_.WaitFor(ready);
    if (st.ok()) st = Pack(*i);
    if (!st.ok()) {
      marked_[*i].store(0, std::memory_order_release);
      return absl::Status(st.code(), absl::StrCat("MarkReady(", plan_.params()[*i].Label(),
                                                  "): packing into its bucket: ", st.message()));
    }
  } else if (ready) {
    BucketState& s = *buckets_[plan_.slot(*i).bucket];
    s.events[s.n_events.fetch_add(1, std::memory_order_relaxed)] = ready;
  }
  OnParamReady(*i);
  return absl::OkStatus();
}

void GradientReducer::OnParamReady(int param_index) {
  const int bucket = plan_.slot(param_index).bucket;
  BucketState& s = *buckets_[bucket];
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  const bool widen = config_.keep_shards_only ? config_.reduce_dtype == DType::kF32 &&
                                                    IsHalf(plan_.buckets()[bucket].dtype)
                                              : static_cast<bool>(s.staging);
  if (widen) {  // complete: widen it now, outside the launch lock, after its producers
    const Bucket& bk = plan_.buckets()[bucket];
    absl::Status st;
    if (config_.keep_shards_only && !s.staging) {
      absl::StatusOr<OwnedBuffer> staging =
          PoolAcquire(bk.padded_count * DTypeSize(DType::kF32), bucket);
      if (staging.ok()) {
        s.staging = *std::move(staging);
      } else {
        st = staging.status();
      }
    }
    const int n = s.n_events.load(std::memory_order_relaxed);  // after pending's acq_rel
    for (int k = 0; k < n && st.ok(); ++k) st = ops_.WaitFor(s.events[k]);
    if (st.ok()) {
      st = ops_.CastScale(BucketData(bucket), bk.dtype, s.staging.get(), DType::kF32,
                          bk.padded_count, ScaleSpec{});
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

void GradientReducer::LaunchStageLocked(int b, int stage) {
  const Bucket& bk = plan_.buckets()[b];
  BucketState& s = *buckets_[b];
  CollectiveOptions opts;
  opts.label = s.label;
  if (stage == 0) {  // the group's stream waits for every producer of the bucket
    opts.ready_events =
        absl::MakeConstSpan(s.events.get(), s.n_events.load(std::memory_order_relaxed));
  }
  Group& g = stage == 0 ? *groups_.shard : *groups_.replica;
  const DType t = CommDType(b);
  const ReduceStep step = StepFor(t, g.size());
  ReductionRequest req{
      &g, CollectiveKind::kAllReduce, nullptr, nullptr, bk.shard_count, t, step.op, opts, b};
  if (stage == 1) {
    req.send = req.recv = config_.keep_shards_only ? CommKept(b) : CommShard(b);
  } else if (config_.mode == ReduceMode::kAllReduce) {
    req.send = req.recv = CommData(b);
    req.count = bk.count;
  } else {
    req.kind = CollectiveKind::kReduceScatter;
    req.send = CommData(b);
    req.recv = CommShard(b);
  }
  absl::StatusOr<WorkPtr> w =
      stage == 0 && !s.prepare_error.ok() ? absl::StatusOr<WorkPtr>(s.prepare_error)
      : config_.scheduler != nullptr      ? config_.scheduler->SubmitReduction(req)
      : req.kind == CollectiveKind::kAllReduce
          ? g.AllReduce(req.send, req.recv, req.count, t, step.op, opts)
          : g.ReduceScatter(req.send, req.recv, req.count, t, step.op, opts);
  BucketState::Stage& rec = s.stage[stage];
  rec.work = w.ok() ? *std::move(w)
                    : Work::Completed(WorkInfo{g.name(), "launch", 0, s.label}, w.status());
  rec.post_divide = w.ok() ? step.post_divide : 1;
  if (tl_ != nullptr) {
    rec.start_ns = Timeline::NowNs();
    if (stage == 0) tl_->Instant(tl_launches_, "launch", b);
  }
}

void GradientReducer::Watch(int first, int last, int stage) {
  for (int b = first; b < last; ++b) {
    const WorkPtr& w = buckets_[b]->stage[stage].work;
    if (w == nullptr) continue;  // hybrid: a bucket whose reduce-scatter failed
    // [this, b, stage] fits std::function's inline buffer: no allocation per launch.
    w->OnComplete([this, b, stage](const absl::Status& st) { OnStageDone(b, stage, st); });
  }
}

void GradientReducer::RecordError(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (first_error_.ok()) first_error_ = s;
}

absl::Status GradientReducer::FinishBackward() {
  if (!in_backward_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("FinishBackward without BeginBackward");
  }
  const auto& params = plan_.params();
  if (sync_ == SyncMode::kNoSync) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (marked_[i].load(std::memory_order_relaxed))
        accumulated_[i].store(1, std::memory_order_relaxed);
    }
    in_backward_.store(false, std::memory_order_release);
    return absl::OkStatus();
  }
  std::vector<int> unmarked;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!marked_[i].load(std::memory_order_acquire)) unmarked.push_back(static_cast<int>(i));
  }
  absl::Status unused_error;
  if (!unmarked.empty() && !config_.allow_unused) {
    std::vector<std::string> names;
    for (size_t k = 0; k < unmarked.size() && k < 10; ++k)
      names.push_back(params[unmarked[k]].Label());
    unused_error = absl::FailedPreconditionError(
        absl::StrCat(unmarked.size(), " parameter(s) were not marked ready in this backward: ",
                     absl::StrJoin(names, ", "), unmarked.size() > 10 ? ", ..." : "",
                     " (set allow_unused to zero-fill and reduce unused parameters)"));
  } else {
    for (int i : unmarked) {
      // A parameter unused now but used in an earlier no_sync microbatch keeps that sum.
      absl::Status st;
      if (config_.keep_shards_only) {
        st = AcquireStorage(
            plan_.slot(i).bucket);  // zero-filled: the slot is zero or the no_sync sum
      } else if (!accumulated_[i].load(std::memory_order_relaxed)) {
        const ParamSlot& s = plan_.slot(i);
        st = ops_.Zero(BucketData(s.bucket) + s.offset * DTypeSize(params[i].dtype),
                       params[i].count * DTypeSize(params[i].dtype));
      } else if (!config_.gradient_as_bucket_view) {
        st = Pack(i);  // the framework's buffer holds the no_sync sum
      }
      if (!st.ok()) {
        RecordError(
            absl::Status(st.code(), absl::StrCat("FinishBackward: preparing unused parameter ",
                                                 params[i].Label(), ": ", st.message())));
      }
      marked_[i].store(1, std::memory_order_relaxed);
      OnParamReady(i);
    }
  }
  // Wait for everything launched (all buckets, unless parameters were missing).
  int launched;
  {
    std::lock_guard<std::mutex> lock(mu_);
    launched = launch_cursor_;
  }
  const absl::Time deadline = absl::Now() + config_.timeout;
  const int64_t wait_start = tl_ != nullptr ? Timeline::NowNs() : 0;
  absl::Status wait_error;
  for (int b = 0; b < launched; ++b) {
    absl::Status s = buckets_[b]->work->WaitUntil(deadline);
    if (!s.ok() && wait_error.ok()) wait_error = s;
  }
  if (tl_ != nullptr)
    tl_->Complete(tl_waits_, "FinishBackward wait", wait_start, Timeline::NowNs());
  for (size_t i = 0; i < plan_.params().size(); ++i)
    accumulated_[i].store(0, std::memory_order_relaxed);
  recording_.store(false, std::memory_order_relaxed);
  in_backward_.store(false, std::memory_order_release);
  if (!unused_error.ok()) return unused_error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_error_.ok()) return first_error_;
  }
  return wait_error;
}

}  // namespace braid::sched
