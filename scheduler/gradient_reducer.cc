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

namespace braid::sched {
namespace {

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};

constexpr size_t kStorageAlign = 64;

}  // namespace

struct GradientReducer::BucketState {
  std::unique_ptr<char, FreeDeleter> data;  // padded_count elements, zero-initialized
  std::string label;                         // "bucket 3": names the bucket in errors
  std::atomic<int> pending{0};               // parameters not yet marked this backward
  bool ready = false;                        // guarded by mu_
  bool first_done = false;                   // guarded by mu_ (hybrid)
  bool failed = false;                       // guarded by mu_ (hybrid)
  WorkPtr work;                              // this backward's final result
  // The collective of each stage in this backward (0: reduce-scatter or all-reduce; 1: the
  // hybrid replica all-reduce): written under mu_ at launch, watched after mu_ is released
  // (OnComplete may run the callback inline, and the callback takes mu_).
  struct Stage {
    WorkPtr work;
    int post_divide = 1;
    int64_t start_ns = 0;  // timeline only
  } stage[2];
  // Hybrid reduce_scatter_only: this rank's shard summed over the window's microbatches so far
  // (each already averaged over the shard group), added in before the replica all-reduce.
  std::unique_ptr<char, FreeDeleter> partial;
  bool has_partial = false;
  // reduce_dtype: the bucket widened (padded_count elements of the reduce dtype).
  std::unique_ptr<char, FreeDeleter> staging;
};

namespace {
char* AlignedAlloc(size_t bytes) {
  char* p = static_cast<char*>(std::aligned_alloc(kStorageAlign, (bytes + kStorageAlign - 1) / kStorageAlign * kStorageAlign));
  BRAID_CHECK(p != nullptr);
  return p;
}
}  // namespace

absl::StatusOr<std::unique_ptr<GradientReducer>> GradientReducer::Create(
    std::vector<ParamSpec> params, ReducerGroups groups, const ReducerConfig& config) {
  if (groups.shard == nullptr) return absl::InvalidArgumentError("reducer: no group given");
  if (config.mode == ReduceMode::kHybrid && groups.replica == nullptr) {
    return absl::InvalidArgumentError("reducer: hybrid mode needs a replica group (see MakeMesh)");
  }
  for (const ParamSpec& p : params) {
    if (!IsValidDType(static_cast<int>(p.dtype)) || !IsFloating(p.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p.Label(), ": gradients must have a floating dtype, got ",
                       IsValidDType(static_cast<int>(p.dtype)) ? DTypeName(p.dtype) : "an invalid one"));
    }
    if (p.device.type != DeviceType::kCpu) {
      return absl::UnimplementedError(absl::StrCat("parameter ", p.Label(), " is on ",
                                                   p.device.ToString(),
                                                   ": device buffers need the NCCL backend"));
    }
  }
  if (config.reduce_dtype != DType::kBF16 && config.reduce_dtype != DType::kF16 &&
      config.reduce_dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce_dtype must be f32 (or bf16/f16: no staging), got ",
        IsValidDType(static_cast<int>(config.reduce_dtype)) ? DTypeName(config.reduce_dtype) : "an invalid dtype"));
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
  return std::unique_ptr<GradientReducer>(new GradientReducer(std::move(plan), groups, config));
}

GradientReducer::GradientReducer(BucketPlan plan, ReducerGroups groups, const ReducerConfig& config)
    : plan_(std::move(plan)),
      groups_(groups),
      config_(config),
      marked_(new std::atomic<uint8_t>[plan_.params().size()]),
      accumulated_(plan_.params().size(), 0),
      external_(plan_.params().size(), nullptr) {
  for (size_t i = 0; i < plan_.params().size(); ++i) marked_[i].store(0);
  if (config_.timeline != nullptr && config_.timeline->enabled()) {
    tl_ = config_.timeline;
    tl_marks_ = tl_->Track("marks");
    tl_launches_ = tl_->Track("bucket launches");
    tl_first_ = tl_->Track(absl::StrCat("group ", groups_.shard->name()));
    if (groups_.replica != nullptr) tl_replica_ = tl_->Track(absl::StrCat("group ", groups_.replica->name()));
    tl_waits_ = tl_->Track("waits");
  }
  AllocateBuckets();
  if (config_.rebuild_bucket_order) {
    ready_order_.reset(new int[plan_.params().size()]);
    rebuild_pending_ = true;
  }
}

void GradientReducer::AllocateBuckets() {
  buckets_.clear();
  for (size_t b = 0; b < plan_.buckets().size(); ++b) {
    auto s = std::make_unique<BucketState>();
    const size_t bytes = (plan_.buckets()[b].bytes() + kStorageAlign - 1) / kStorageAlign * kStorageAlign;
    s->data.reset(static_cast<char*>(std::aligned_alloc(kStorageAlign, bytes)));
    BRAID_CHECK(s->data != nullptr);
    std::memset(s->data.get(), 0, bytes);
    s->label = absl::StrCat("bucket ", b);
    if (config_.reduce_dtype == DType::kF32 && IsHalf(plan_.buckets()[b].dtype)) {
      s->staging.reset(AlignedAlloc(plan_.buckets()[b].padded_count * DTypeSize(DType::kF32)));
    }
    buckets_.push_back(std::move(s));
  }
}

absl::StatusOr<bool> GradientReducer::RebuildBucketsIfPending() {
  if (in_backward_.load()) {
    return absl::FailedPreconditionError("RebuildBucketsIfPending during a backward");
  }
  if (!rebuild_pending_ || recording_.load() || ready_count_.load() == 0) return false;
  // This rank's order: the recorded marks, then parameters never marked (reverse registration).
  const int n = static_cast<int>(plan_.params().size());
  std::vector<int64_t> order;
  std::vector<char> seen(n, 0);
  for (int k = 0; k < ready_count_.load(); ++k) {
    order.push_back(ready_order_[k]);
    seen[ready_order_[k]] = 1;
  }
  for (int i = n - 1; i >= 0; --i) {
    if (!seen[i]) order.push_back(i);
  }
  // Adopt world rank 0's: the shard group's rank 0, then (hybrid) the replica group's rank 0,
  // which by then holds world rank 0's order.
  std::vector<Group*> chain = {groups_.shard};
  if (config_.mode == ReduceMode::kHybrid) chain.push_back(groups_.replica);
  for (Group* g : chain) {
    CollectiveOptions opts;
    opts.label = "bucket order rebuild";
    ASSIGN_OR_RETURN(WorkPtr w, g->Broadcast(order.data(), order.size(), DType::kI64, 0, opts));
    RETURN_IF_ERROR(w->Wait(config_.timeout));
  }
  std::vector<int> new_order(order.begin(), order.end());
  ASSIGN_OR_RETURN(BucketPlan plan, BucketPlan::BuildInOrder(plan_.params(), new_order, plan_.options()));
  for (Group* g : chain) RETURN_IF_ERROR(VerifyPlanAcrossRanks(plan, *g, config_.timeout));
  // Move every gradient to its new slot.
  BucketPlan old_plan = std::move(plan_);
  std::vector<std::unique_ptr<BucketState>> old_buckets = std::move(buckets_);
  plan_ = std::move(plan);
  AllocateBuckets();
  for (int i = 0; i < n; ++i) {
    const ParamSpec& p = plan_.params()[i];
    const size_t es = DTypeSize(p.dtype);
    std::memcpy(BucketData(plan_.slot(i).bucket) + plan_.slot(i).offset * es,
                old_buckets[old_plan.slot(i).bucket]->data.get() + old_plan.slot(i).offset * es,
                p.count * es);
  }
  rebuild_pending_ = false;
  ++plan_generation_;
  return true;
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
      Log().error("gradient reducer destroyed with {} still in flight; leaking its storage", b->label);
      (void)b->data.release();
    }
  }
}

char* GradientReducer::BucketData(int b) const { return buckets_[b]->data.get(); }

char* GradientReducer::ShardData(int b) const {
  const Bucket& bk = plan_.buckets()[b];
  const int shard_rank = config_.mode == ReduceMode::kAllReduce ? 0 : groups_.shard->rank();
  return BucketData(b) + static_cast<size_t>(shard_rank) * bk.shard_count * DTypeSize(bk.dtype);
}

DType GradientReducer::CommDType(int b) const {
  return buckets_[b]->staging != nullptr ? DType::kF32 : plan_.buckets()[b].dtype;
}

char* GradientReducer::CommData(int b) const {
  return buckets_[b]->staging != nullptr ? buckets_[b]->staging.get() : BucketData(b);
}

char* GradientReducer::CommShard(int b) const {
  if (buckets_[b]->staging == nullptr) return ShardData(b);
  const int shard_rank = config_.mode == ReduceMode::kAllReduce ? 0 : groups_.shard->rank();
  return CommData(b) + static_cast<size_t>(shard_rank) * plan_.buckets()[b].shard_count * DTypeSize(DType::kF32);
}

absl::StatusOr<TensorView> GradientReducer::GradView(ParamId id) const {
  ASSIGN_OR_RETURN(int i, plan_.IndexOf(id));
  const ParamSpec& p = plan_.params()[i];
  const ParamSlot& s = plan_.slot(i);
  return TensorView{BucketData(s.bucket) + s.offset * DTypeSize(p.dtype), p.count, p.dtype, p.device};
}

absl::Status GradientReducer::SetGradBuffer(ParamId id, void* grad) {
  ASSIGN_OR_RETURN(int i, plan_.IndexOf(id));
  if (config_.gradient_as_bucket_view) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SetGradBuffer(", plan_.params()[i].Label(),
        "): gradients are bucket views (gradient_as_bucket_view); use GradView instead"));
  }
  if (grad == nullptr && plan_.params()[i].count > 0) {
    return absl::InvalidArgumentError(absl::StrCat("SetGradBuffer(", plan_.params()[i].Label(), "): null buffer"));
  }
  if (in_backward_.load()) {
    return absl::FailedPreconditionError(absl::StrCat("SetGradBuffer(", plan_.params()[i].Label(), ") during a backward"));
  }
  external_[i] = grad;
  return absl::OkStatus();
}

void GradientReducer::Pack(int i) {
  const ParamSpec& p = plan_.params()[i];
  const ParamSlot& s = plan_.slot(i);
  std::memcpy(BucketData(s.bucket) + s.offset * DTypeSize(p.dtype), external_[i], p.count * DTypeSize(p.dtype));
}

void GradientReducer::Unpack(int b) {
  for (int i : plan_.buckets()[b].params) {
    const ParamSpec& p = plan_.params()[i];
    std::memcpy(external_[i], BucketData(b) + plan_.slot(i).offset * DTypeSize(p.dtype),
                p.count * DTypeSize(p.dtype));
  }
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
      s.pending.store(static_cast<int>(plan_.buckets()[b].params.size()), std::memory_order_relaxed);
      s.ready = s.first_done = s.failed = false;
      s.stage[0].work.reset();
      s.stage[1].work.reset();
      if (mode != SyncMode::kNoSync) {
        s.work = works_.Create(WorkInfo{groups_.shard->name(), "reduction", b, s.label});
      }
    }
  }
  in_backward_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status GradientReducer::MarkReady(ParamId id, DeviceEvent ready) {
  if (!in_backward_.load(std::memory_order_acquire)) {
    auto i = plan_.IndexOf(id);
    return absl::FailedPreconditionError(absl::StrCat(
        "MarkReady(", i.ok() ? plan_.params()[*i].Label() : absl::StrCat("id ", id),
        ") outside a backward: call BeginBackward first"));
  }
  absl::StatusOr<int> i = plan_.IndexOf(id);
  if (!i.ok()) return absl::NotFoundError(absl::StrCat("MarkReady: unknown parameter id ", id));
  if (marked_[*i].exchange(1, std::memory_order_acq_rel) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MarkReady: parameter ", plan_.params()[*i].Label(), " was already marked ready in this backward"));
  }
  if (tl_ != nullptr) tl_->Instant(tl_marks_, "mark", *i);
  if (recording_.load(std::memory_order_relaxed)) ready_order_[ready_count_.fetch_add(1)] = *i;
  if (sync_ == SyncMode::kNoSync) return absl::OkStatus();
  if (!config_.gradient_as_bucket_view) Pack(*i);
  OnParamReady(*i);
  return absl::OkStatus();
}

void GradientReducer::OnParamReady(int param_index) {
  const int bucket = plan_.slot(param_index).bucket;
  BucketState& s = *buckets_[bucket];
  if (s.pending.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (s.staging != nullptr) {  // complete: widen it now, outside the launch lock
    const Bucket& bk = plan_.buckets()[bucket];
    CastScale(BucketData(bucket), bk.dtype, s.staging.get(), DType::kF32, bk.padded_count, ScaleSpec{});
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
  Group& g = stage == 0 ? *groups_.shard : *groups_.replica;
  const DType t = CommDType(b);
  const ReduceStep step = StepFor(t, g.size());
  absl::StatusOr<WorkPtr> w =
      stage == 1 ? g.AllReduce(CommShard(b), CommShard(b), bk.shard_count, t, step.op, opts)
      : config_.mode == ReduceMode::kAllReduce
          ? g.AllReduce(CommData(b), CommData(b), bk.count, t, step.op, opts)
          : g.ReduceScatter(CommData(b), CommShard(b), bk.shard_count, t, step.op, opts);
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

void GradientReducer::OnStageDone(int b, int stage, const absl::Status& st) {
  const BucketState::Stage& rec = buckets_[b]->stage[stage];
  if (tl_ != nullptr) {
    const char* name = stage == 1 ? "allreduce (replicas)"
                       : config_.mode == ReduceMode::kAllReduce ? "allreduce"
                                                                : "reduce_scatter";
    tl_->Complete(stage == 1 ? tl_replica_ : tl_first_, name, rec.start_ns, Timeline::NowNs(), b);
  }
  const Bucket& bk = plan_.buckets()[b];
  const bool whole = config_.mode == ReduceMode::kAllReduce;
  const DType t = CommDType(b);
  if (st.ok() && rec.post_divide > 1) {  // f16: the divide after the sum
    char* p = whole ? CommData(b) : CommShard(b);
    CastScale(p, t, p, t, whole ? bk.count : bk.shard_count, ScaleSpec{false, 1.0, rec.post_divide});
  }
  const bool last_stage = config_.mode != ReduceMode::kHybrid || stage == 1;
  if (last_stage) {
    if (st.ok() && buckets_[b]->staging != nullptr) {  // round once, to the gradient dtype
      CastScale(whole ? CommData(b) : CommShard(b), t,
                whole ? BucketData(b) : ShardData(b), bk.dtype,
                whole ? bk.count : bk.shard_count, ScaleSpec{});
    }
    if (st.ok() && !config_.gradient_as_bucket_view && whole) Unpack(b);
    FinishBucket(b, st);
    return;
  }
  // Hybrid: the shard is reduced within its replica.
  if (st.ok() && sync_ == SyncMode::kReduceScatterOnly) {
    AccumulatePartial(b);  // and the microbatch's gradients are consumed: zero them
    std::memset(BucketData(b), 0, plan_.buckets()[b].bytes());
    FinishBucket(b, st);
    return;
  }
  if (st.ok()) AddPartialInto(b);
  // All-reduce it across replicas, in bucket order (a failed bucket is skipped: its error
  // already ends this backward).
  if (!st.ok()) FinishBucket(b, st);
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

void GradientReducer::AccumulatePartial(int b) {
  BucketState& s = *buckets_[b];
  const Bucket& bk = plan_.buckets()[b];
  const DType t = CommDType(b);
  const size_t bytes = bk.shard_count * DTypeSize(t);
  if (s.partial == nullptr) s.partial.reset(AlignedAlloc(bytes));
  if (!s.has_partial) {
    std::memcpy(s.partial.get(), CommShard(b), bytes);  // a copy, not 0 + x: keeps -0.0
    s.has_partial = true;
    return;
  }
  const void* in[2] = {s.partial.get(), CommShard(b)};
  ReduceInto(in, 2, s.partial.get(), bk.shard_count, t, ReduceOp::Sum(), 2);
}

void GradientReducer::AddPartialInto(int b) {
  BucketState& s = *buckets_[b];
  if (!s.has_partial) return;
  const Bucket& bk = plan_.buckets()[b];
  const void* in[2] = {s.partial.get(), CommShard(b)};
  ReduceInto(in, 2, CommShard(b), bk.shard_count, CommDType(b), ReduceOp::Sum(), 2);
  s.has_partial = false;
}

void GradientReducer::FinishBucket(int b, absl::Status s) {
  if (!s.ok()) RecordError(s);
  WorkPtr w = buckets_[b]->work;  // keeps the Work alive while its callbacks run
  w->Complete(std::move(s));
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
      if (marked_[i].load(std::memory_order_relaxed)) accumulated_[i] = 1;
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
    for (size_t k = 0; k < unmarked.size() && k < 10; ++k) names.push_back(params[unmarked[k]].Label());
    unused_error = absl::FailedPreconditionError(absl::StrCat(
        unmarked.size(), " parameter(s) were not marked ready in this backward: ",
        absl::StrJoin(names, ", "), unmarked.size() > 10 ? ", ..." : "",
        " (set allow_unused to zero-fill and reduce unused parameters)"));
  } else {
    for (int i : unmarked) {
      // A parameter unused now but used in an earlier no_sync microbatch keeps that sum.
      if (!accumulated_[i]) {
        const ParamSlot& s = plan_.slot(i);
        std::memset(BucketData(s.bucket) + s.offset * DTypeSize(params[i].dtype), 0,
                    params[i].count * DTypeSize(params[i].dtype));
      } else if (!config_.gradient_as_bucket_view) {
        Pack(i);  // the framework's buffer holds the no_sync sum
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
  if (tl_ != nullptr) tl_->Complete(tl_waits_, "FinishBackward wait", wait_start, Timeline::NowNs());
  std::fill(accumulated_.begin(), accumulated_.end(), 0);
  recording_.store(false, std::memory_order_relaxed);
  in_backward_.store(false, std::memory_order_release);
  if (!unused_error.ok()) return unused_error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!first_error_.ok()) return first_error_;
  }
  return wait_error;
}

void GradientReducer::ZeroGrads() {
  for (size_t b = 0; b < buckets_.size(); ++b) ZeroBucket(static_cast<int>(b));
}

void GradientReducer::ZeroBucket(int b) {
  std::memset(BucketData(b), 0, plan_.buckets()[b].bytes());
  buckets_[b]->has_partial = false;
}

}  // namespace braid::sched
