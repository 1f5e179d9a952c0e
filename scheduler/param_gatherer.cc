#include "scheduler/param_gatherer.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/logging.h"
#include "comm/status_macros.h"
#include "scheduler/plan_check.h"

namespace braid::sched {
namespace {

// `bytes` of the group's memory (host, or device on device groups), zero-filled (queued on the
// group's stream on device: ordered before its collectives).
absl::StatusOr<OwnedBuffer> AllocateZeroed(MemoryStats* memory, BufferOps& ops, size_t bytes,
                                           MemoryUse use, const std::string& what) {
  ASSIGN_OR_RETURN(OwnedBuffer b, CountedAllocate(memory, ops, bytes, use, what));
  RETURN_IF_ERROR(ops.Zero(b.get(), bytes));
  return b;
}

uint64_t MixIssue(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {  // FNV-1a over the 8 bytes of v
    h ^= (v >> (8 * i)) & 0xffu;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

// kNotGathered: never gathered, released, or the last gather failed.
enum class GatherState { kNotGathered, kInFlight, kGathered };

struct ParamGatherer::BucketState {
  OwnedBuffer full;   // padded_count elements; null while released (fully_sharded)
  OwnedBuffer shard;  // fully_sharded only: this rank's shard, shard_count elements
  GatherState state = GatherState::kNotGathered;
  WorkPtr work;  // the latest gather
  // Timeline only: the latest gather's issue time, completion time (written by its callback)
  // and its predecessor's on the group; whether its span is still to be recorded.
  int64_t issued_ns = 0;
  std::shared_ptr<std::atomic<int64_t>> done_ns, prev_done_ns;
  bool span_pending = false;
  std::string label;  // "bucket 3": names the bucket in errors and in the Work
};

absl::StatusOr<std::unique_ptr<ParamGatherer>> ParamGatherer::Create(const BucketPlan& plan,
                                                                     Group* shard_group,
                                                                     const GathererConfig& config) {
  if (shard_group == nullptr) return absl::InvalidArgumentError("param gatherer: no group given");
  if (plan.options().shards != shard_group->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("param gatherer: the plan was built for ", plan.options().shards,
                     " shard(s) but group '", shard_group->name(), "' has ", shard_group->size(),
                     " rank(s) (build the plan with PlanOptions::shards = the group's size)"));
  }
  const Capabilities caps = shard_group->capabilities();
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bk = plan.buckets()[b];
    const bool on_device = bk.device.type != DeviceType::kCpu;
    if (on_device ? !caps.device_memory : !caps.host_memory) {
      return absl::UnimplementedError(absl::StrCat(
          "param gatherer: bucket ", b, " (first parameter ", plan.params()[bk.params[0]].Label(),
          ") is on ", bk.device.ToString(), ": group '", shard_group->name(), "' (backend ",
          shard_group->backend_name(), ") does not gather ",
          on_device ? "device buffers (they need the NCCL backend)" : "host buffers"));
    }
  }
  if (config.shared_pool != nullptr && !shard_group->buffer_ops().synchronous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("param gatherer: a shared buffer pool is for host groups; group '",
                     shard_group->name(), "' queues its operations on a device stream"));
  }
  RETURN_IF_ERROR(CheckQuant(plan, *shard_group, config));
  if (config.verify_plan)
    RETURN_IF_ERROR(VerifyPlanAcrossRanks(plan, *shard_group, config.timeout));
  auto g = std::unique_ptr<ParamGatherer>(new ParamGatherer(plan, shard_group, config));
  BufferOps& ops = shard_group->buffer_ops();
  for (size_t b = 0; b < g->buckets_.size(); ++b) {
    BucketState& s = *g->buckets_[b];
    const Bucket& bk = plan.buckets()[b];
    absl::StatusOr<OwnedBuffer> buf =
        config.fully_sharded
            ? AllocateZeroed(config.memory, ops, bk.shard_count * DTypeSize(bk.dtype),
                             MemoryUse::kParamShards, s.label + " (shard)")
            : AllocateZeroed(config.memory, ops, bk.bytes(), MemoryUse::kParamGather,
                             s.label);  // lives as long as the gatherer
    if (!buf.ok()) {
      return absl::Status(buf.status().code(),
                          absl::StrCat("param gatherer: cannot allocate bucket ", b, " (",
                                       bk.bytes(), " bytes): ", buf.status().message()));
    }
    (config.fully_sharded ? s.shard : s.full) = *std::move(buf);
  }
  // Device: the zeroes land before anyone writes a shard from another stream or the host.
  if (!ops.synchronous()) RETURN_IF_ERROR(ops.Synchronize(absl::Now() + config.timeout));
  return g;
}

ParamGatherer::ParamGatherer(BucketPlan plan, Group* group, const GathererConfig& config)
    : plan_(std::move(plan)),
      group_(group),
      config_(config),
      scheduler_(config.scheduler),
      recent_(kRecentIssues, -1) {
  if (config_.timeline != nullptr && config_.timeline->enabled()) {
    tl_ = config_.timeline;
    tl_group_ = tl_->Track(absl::StrCat("group ", group_->name()));
    tl_waits_ = tl_->Track("waits");
    tl_last_done_ = std::make_shared<std::atomic<int64_t>>(0);
  }
  for (size_t b = 0; b < plan_.buckets().size(); ++b) {
    const Bucket& bk = plan_.buckets()[b];
    auto s = std::make_unique<BucketState>();
    (void)bk;
    s->label = absl::StrCat("bucket ", b);
    buckets_.push_back(std::move(s));
  }
}

ParamGatherer::~ParamGatherer() {
  // No other thread may call in now, so mu_ is not needed for the *Locked helpers.
  bool in_flight = false;
  for (int b = 0; b < num_buckets(); ++b) {
    BucketState& s = *buckets_[b];
    if (s.work == nullptr) continue;
    if (!s.work->Done()) (void)s.work->Wait(config_.timeout);
    if (s.work->Done()) {
      RecordGatherSpanLocked(b);  // a gather nobody waited for
      continue;
    }
    // The all-gather may still write into this buffer: leak it rather than free it under it.
    Log().error(
        "param gatherer destroyed with the all-gather of {} still in flight; leaking its buffer",
        s.label);
    (void)s.full.release();
    in_flight = true;
  }
  if (in_flight) (void)cast_records_.release();  // the same for the device cast gathers' records
  // Buffers still attached leave the shared pool's count with this gatherer.
  for (int b = 0; config_.fully_sharded && config_.shared_pool && b < num_buckets(); ++b) {
    if (buckets_[b]->full) config_.shared_pool->Unhold(plan_.buckets()[b].bytes());
  }
}

absl::Status ParamGatherer::CheckBucket(const char* what, int b) const {
  if (b >= 0 && b < num_buckets()) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(what, " bucket ", b, ": no such bucket (the plan has ",
                                            num_buckets(), " buckets)"));
}

char* ParamGatherer::ShardData(int b) const {
  const BucketState& s = *buckets_[b];
  if (config_.fully_sharded) return s.shard.get();
  const Bucket& bk = plan_.buckets()[b];
  return s.full.get() + static_cast<size_t>(group_->rank()) * bk.shard_count * DTypeSize(bk.dtype);
}

absl::StatusOr<TensorView> ParamGatherer::ParamView(ParamId id) const {
  absl::StatusOr<int> i = plan_.IndexOf(id);
  if (!i.ok()) return WithContext(i.status(), "parameter view");
  const ParamSpec& p = plan_.params()[*i];
  const ParamSlot& slot = plan_.slot(*i);
  std::lock_guard<std::mutex> lock(mu_);
  const BucketState& s = *buckets_[slot.bucket];
  if (!s.full) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter ", p.Label(), ": ", s.label,
                     " is released (fully_sharded); enter its unit first (braid_unit_enter)"));
  }
  return TensorView{s.full.get() + slot.offset * DTypeSize(p.dtype), p.count, p.dtype, p.device};
}

absl::StatusOr<TensorView> ParamGatherer::ShardView(int b) const {
  RETURN_IF_ERROR(CheckBucket("the shard of", b));
  const Bucket& bk = plan_.buckets()[b];
  return TensorView{ShardData(b), bk.shard_count, bk.dtype, bk.device};
}

absl::Status ParamGatherer::LaunchLocked(int b, DeviceEvent ready, bool exact) {
  BucketState& s = *buckets_[b];
  const Bucket& bk = plan_.buckets()[b];
  const size_t shard_bytes = bk.shard_count * DTypeSize(bk.dtype);
  BufferOps& ops = group_->buffer_ops();
  bool pool_counted = false;  // the shared pool counts the buffer allocated below
  if (!s.full && config_.shared_pool) {
    // At a bounded pool's limit this waits (mu_ held) for a launched reduction's storage to
    // come back; such a wait ends without any call into this gatherer (buffer_pool.h).
    absl::StatusOr<OwnedBuffer> pooled = config_.shared_pool->Acquire(bk.bytes(), config_.timeout);
    if (!pooled.ok()) {
      return absl::Status(pooled.status().code(),
                          absl::StrCat("gathering ", s.label, ": ", pooled.status().message(),
                                       "; raise pool_limit_bytes (0: no limit) or the timeout"));
    }
    s.full = *std::move(pooled);
    pool_counted = !s.full;
  }
  if (!s.full && config_.reuse_buffers) {
    // Best fit from the pool: the smallest buffer of at least bk.bytes(), wasting at most half.
    auto it = pool_.lower_bound(bk.bytes());
    if (it != pool_.end() && it->first <= 2 * bk.bytes()) {
      s.full = std::move(it->second);
      pooled_bytes_ -= static_cast<int64_t>(it->first);
      pool_.erase(it);
    }
  }
  if (!s.full) {
    absl::StatusOr<OwnedBuffer> full =
        AllocateZeroed(config_.memory, ops, bk.bytes(), MemoryUse::kParamGather, s.label);
    if (!full.ok()) {
      if (pool_counted) config_.shared_pool->Unhold(bk.bytes());
      return absl::Status(full.status().code(),
                          absl::StrCat("gathering ", s.label, ": cannot allocate ", bk.bytes(),
                                       " bytes: ", full.status().message()));
    }
    s.full = *std::move(full);
  }
  if (config_.quant.dtype != GatherDType::kExact && !exact) {
    absl::StatusOr<WorkPtr> w = LaunchQuantizedLocked(b, s.full.get(), ready);
    if (!w.ok()) {
      return WithContext(w.status(), absl::StrCat("gathering ", s.label, " as ",
                                                  GatherDTypeName(config_.quant.dtype),
                                                  " on group '", group_->name(), "'"));
    }
    RecordLaunchLocked(b, *std::move(w));
    return absl::OkStatus();
  }
  // Fully sharded: out of place from the kept shard, so the backend copies this rank's block
  // with the others, off the calling thread (the shard is final: before_gather waited for its
  // step, and nothing writes it until this unit's gradients arrive, after the gather). The
  // backend waits for `ready` (a producer of the shard, e.g. the optimizer's step) before it
  // reads the shard. Else in place: this rank's block is already in `full`.
  const char* mine = config_.fully_sharded
                         ? s.shard.get()
                         : s.full.get() + static_cast<size_t>(group_->rank()) * shard_bytes;
  CollectiveOptions opts;
  opts.label = s.label;
  opts.ready_event = ready;
  absl::StatusOr<WorkPtr> w = group_->AllGather(mine, s.full.get(), bk.shard_count, bk.dtype, opts);
  if (!w.ok()) {
    return WithContext(w.status(),
                       absl::StrCat("gathering ", s.label, " on group '", group_->name(), "'"));
  }
  RecordLaunchLocked(b, *std::move(w));
  return absl::OkStatus();
}

void ParamGatherer::RecordLaunchLocked(int b, WorkPtr w) {
  BucketState& s = *buckets_[b];
  s.work = std::move(w);
  s.state = GatherState::kInFlight;
  if (OpScheduler* sch = scheduler_.load()) sch->TrackUrgent(s.work, b);
  issue_hash_ = MixIssue(issue_hash_, static_cast<uint64_t>(b));
  recent_[issued_ % kRecentIssues] = b;
  ++issued_;
  if (tl_ != nullptr) {
    s.issued_ns = Timeline::NowNs();
    s.prev_done_ns = tl_last_done_;
    s.done_ns = tl_last_done_ = std::make_shared<std::atomic<int64_t>>(0);
    s.span_pending = true;
    // Runs on the completing thread, possibly after this object is gone: touches only its own.
    s.work->OnComplete([done = s.done_ns](const absl::Status&) { done->store(Timeline::NowNs()); });
  }
}

absl::Status ParamGatherer::Prefetch(int b, DeviceEvent ready, bool exact) {
  RETURN_IF_ERROR(CheckBucket("prefetching", b));
  std::lock_guard<std::mutex> lock(mu_);
  const BucketState& s = *buckets_[b];
  if (s.state == GatherState::kInFlight) {
    return absl::FailedPreconditionError(
        absl::StrCat("prefetching ", s.label, ": its all-gather on group '", group_->name(),
                     "' is already in flight (prefetched twice without a wait)"));
  }
  return LaunchLocked(b, ready, exact);
}

void ParamGatherer::RecordGatherSpanLocked(int b) {
  BucketState& s = *buckets_[b];
  if (tl_ == nullptr || !s.span_pending) return;
  s.span_pending = false;
  int64_t end = s.done_ns->load();
  if (end == 0) end = Timeline::NowNs();  // Done, but its callback has not run yet
  const int64_t start = std::max(s.issued_ns, s.prev_done_ns->load());
  tl_->Complete(tl_group_, s.work->status().ok() ? "allgather" : "allgather failed", start, end, b);
}

absl::Status ParamGatherer::AwaitGather(const char* caller, int b, const WorkPtr& w,
                                        absl::Time deadline) {
  const int64_t wait_start = tl_ != nullptr ? Timeline::NowNs() : 0;
  absl::Status st;
  {
    OpScheduler::WaitScope stalled(w->Done() ? nullptr
                                             : scheduler_.load());  // the model waits on it
    st = w->WaitUntil(deadline);
  }
  if (tl_ != nullptr) tl_->Complete(tl_waits_, "wait params", wait_start, Timeline::NowNs(), b);
  std::lock_guard<std::mutex> lock(mu_);
  BucketState& s = *buckets_[b];
  if (s.work == w && s.state == GatherState::kInFlight) {
    if (w->Done()) RecordGatherSpanLocked(b);
    if (st.ok()) {
      s.state = GatherState::kGathered;
    } else if (w->Done()) {
      s.state = GatherState::kNotGathered;  // failed: contents unspecified; a later wait retries
    }  // else merely late: still in flight, and a later wait may succeed
  }
  if (st.ok()) return st;
  return WithContext(
      st, absl::StrCat(caller, ": gathering ", s.label, " on group '", group_->name(), "'"));
}

absl::Status ParamGatherer::WaitParams(int b) {
  RETURN_IF_ERROR(CheckBucket("waiting for", b));
  WorkPtr w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    BucketState& s = *buckets_[b];
    if (s.state == GatherState::kGathered) return absl::OkStatus();
    if (s.state == GatherState::kNotGathered) RETURN_IF_ERROR(LaunchLocked(b, DeviceEvent{}));
    w = s.work;
  }
  return AwaitGather("waiting for parameters", b, w, absl::Now() + config_.timeout);
}

absl::Status ParamGatherer::WaitAll() {
  std::vector<std::pair<int, WorkPtr>> in_flight;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int b = 0; b < num_buckets(); ++b) {
      if (buckets_[b]->state == GatherState::kInFlight)
        in_flight.emplace_back(b, buckets_[b]->work);
    }
  }
  const absl::Time deadline = absl::Now() + config_.timeout;
  absl::Status first;
  for (const auto& [b, w] : in_flight) {
    absl::Status st = AwaitGather("waiting for every parameter", b, w, deadline);
    if (first.ok()) first = st;
  }
  return first;
}

absl::Status ParamGatherer::Release(int b) {
  RETURN_IF_ERROR(CheckBucket("releasing", b));
  std::lock_guard<std::mutex> lock(mu_);
  BucketState& s = *buckets_[b];
  if (s.state == GatherState::kInFlight) {
    return absl::FailedPreconditionError(absl::StrCat("releasing ", s.label,
                                                      ": its all-gather on group '", group_->name(),
                                                      "' is in flight; wait for it first"));
  }
  if (!config_.fully_sharded) return absl::OkStatus();
  if (s.full && config_.shared_pool) {
    config_.shared_pool->Give(std::move(s.full), plan_.buckets()[b].bytes());
  } else if (s.full && config_.reuse_buffers) {
    const size_t bytes = s.full.bytes();
    pooled_bytes_ += static_cast<int64_t>(bytes);
    pool_.emplace(bytes, std::move(s.full));
  }
  s.full.Reset();
  s.state = GatherState::kNotGathered;
  return absl::OkStatus();
}

bool ParamGatherer::PoolFits(int b) const {
  if (b < 0 || b >= num_buckets() || !config_.fully_sharded || !config_.shared_pool) return true;
  // Not under mu_ (a launch may hold it while it waits on the pool); a released bucket, the
  // only kind a prefetch launches, holds no buffer.
  return config_.shared_pool->Fits(plan_.buckets()[b].bytes());
}

WorkPtr ParamGatherer::GatherWork(int b) const {
  if (b < 0 || b >= num_buckets()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return buckets_[b]->work;
}

bool ParamGatherer::IsGathered(int b) const {
  if (b < 0 || b >= num_buckets()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return buckets_[b]->state == GatherState::kGathered;
}

absl::Status ParamGatherer::CheckIssueOrder() {
  constexpr size_t kRecord = 2 + kRecentIssues;  // count, hash, recent buckets (oldest first)
  const int n = group_->size();
  // Owned by the completion callback too, so a late collective never writes freed memory.
  auto bufs = std::make_shared<std::vector<int64_t>>(kRecord * (1 + static_cast<size_t>(n)), -1);
  int64_t* mine = bufs->data();
  int64_t* all = bufs->data() + kRecord;
  WorkPtr w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mine[0] = static_cast<int64_t>(issued_);
    mine[1] = static_cast<int64_t>(issue_hash_);
    const uint64_t shown = std::min<uint64_t>(issued_, kRecentIssues);
    for (uint64_t k = 0; k < shown; ++k)
      mine[2 + k] = recent_[(issued_ - shown + k) % kRecentIssues];
    CollectiveOptions opts;
    opts.label = "gather order check";
    absl::StatusOr<WorkPtr> launched = group_->AllGather(mine, all, kRecord, DType::kI64, opts);
    if (!launched.ok()) return WithContext(launched.status(), "checking the gather order");
    w = *launched;
  }
  w->OnComplete([bufs](const absl::Status&) {});
  const absl::Status st = w->Wait(config_.timeout);
  if (!st.ok()) return WithContext(st, "checking the gather order");
  bool same = true;
  for (int r = 1; r < n && same; ++r) same = std::equal(all, all + 2, all + r * kRecord);
  if (same) return absl::OkStatus();
  std::vector<std::string> per_rank;
  for (int r = 0; r < n; ++r) {
    const int64_t* rec = all + r * kRecord;
    std::vector<int64_t> seq;
    for (size_t k = 2; k < kRecord && rec[k] >= 0; ++k) seq.push_back(rec[k]);
    per_rank.push_back(absl::StrCat("rank ", r, " issued ", rec[0], " gather(s), latest buckets [",
                                    absl::StrJoin(seq, ", "), "]"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("all-gather order differs across the ranks of group '", group_->name(),
                   "' (rank-order contract broken: parameter gathers (braid_unit_enter, "
                   "braid_optimizer_wait_params) must take the same buckets in the same "
                   "order on every rank; gathered contents may be in the wrong buckets): ",
                   absl::StrJoin(per_rank, "; ")));
}

absl::StatusOr<std::vector<int64_t>> ParamGatherer::ExchangeInts(const std::vector<int64_t>& mine,
                                                                 absl::string_view what) {
  const size_t k = mine.size();
  const int n = group_->size();
  // Owned by the completion callback too, so a late collective never writes freed memory.
  auto bufs = std::make_shared<std::vector<int64_t>>(k * (1 + static_cast<size_t>(n)), -1);
  std::copy(mine.begin(), mine.end(), bufs->begin());
  WorkPtr w;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CollectiveOptions opts;
    opts.label = what;  // the caller's, alive until the launch copied it
    absl::StatusOr<WorkPtr> launched =
        group_->AllGather(bufs->data(), bufs->data() + k, k, DType::kI64, opts);
    if (!launched.ok()) return WithContext(launched.status(), what);
    w = *launched;
  }
  w->OnComplete([bufs](const absl::Status&) {});
  const absl::Status st = w->Wait(config_.timeout);
  if (!st.ok()) return WithContext(st, what);
  return std::vector<int64_t>(bufs->begin() + k, bufs->end());
}

int64_t ParamGatherer::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t sum = 0;
  for (const auto& s : buckets_) sum += s->full ? static_cast<int64_t>(s->full.bytes()) : 0;
  return sum;
}

int64_t ParamGatherer::pooled_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pooled_bytes_;
}

void ParamGatherer::TrimPool() {
  std::multimap<size_t, OwnedBuffer> freed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    freed.swap(pool_);
    pooled_bytes_ = 0;
  }
  if (config_.shared_pool != nullptr) config_.shared_pool->Trim();
}

}  // namespace braid::sched
