#include "scheduler/used_map.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::sched {

struct UsedMap::State {
  std::vector<int32_t> counts;  // the all-reduce's host buffer (device groups: a copy back)
  std::vector<uint8_t> map;     // the agreed map: counts != 0
  void Agree() {
    for (size_t i = 0; i < counts.size(); ++i) map[i] = counts[i] != 0;
  }
};

UsedMap::UsedMap(const BucketPlan& plan, const ReducerGroups& groups, const ReducerConfig& config)
    : plan_(plan),
      groups_(groups),
      config_(config),
      ops_(groups_.shard->buffer_ops()),
      window_(new std::atomic<uint8_t>[plan.params().size()]),
      window_size_(plan.params().size()),
      state_(std::make_shared<State>()) {
  for (size_t i = 0; i < window_size_; ++i) window_[i].store(0, std::memory_order_relaxed);
  state_->counts.assign(window_size_, 0);
  state_->map.assign(window_size_, 1);  // before any agreement: every parameter counts as used
}

UsedMap::~UsedMap() {
  // The all-reduce writes into state_ (kept alive by its callback) or device_: wait for it.
  if (shard_work_ != nullptr && !shard_work_->Done() && !shard_work_->Wait(config_.timeout).ok() &&
      !shard_work_->Done()) {
    device_.release();  // still in flight: leak the device buffer rather than free it under it
  }
}

void UsedMap::Begin(SyncMode mode) {
  agreeing_ = config_.agree_unused != UnusedAgreement::kNone && mode == SyncMode::kSync;
  if (!agreeing_) return;
  issued_ = false;
  issue_error_ = absl::OkStatus();
  shard_work_.reset();
  agreed_ = Work::Create(WorkInfo{groups_.shard->name(), "used map", 0, "used parameters"});
  if (config_.static_graph && agreed_once_) agreed_->Complete(absl::OkStatus());  // map kept
}

absl::Status UsedMap::IssueDeclared(const std::vector<uint8_t>& declared) {
  if (!agreeing_ || issued_ || (config_.static_graph && agreed_once_)) return absl::OkStatus();
  // kDeclaredAtFinish: Finish agrees on the marks (a declared parameter is never marked).
  if (config_.agree_unused == UnusedAgreement::kDeclaredAtFinish) return absl::OkStatus();
  // static_graph's first agreement: the framework has not seen the graph yet (torch's first
  // static iteration searches nothing), so a parameter it neither declares nor marks is unused;
  // Finish agrees on the marks, as torch's reducer then does.
  if (config_.static_graph) return absl::OkStatus();
  std::vector<int32_t> local(window_size_);
  for (size_t i = 0; i < window_size_; ++i) {
    local[i] = window_[i].load(std::memory_order_relaxed) || !declared[i] ? 1 : 0;
  }
  return IssueShard(local);
}

absl::Status UsedMap::IssueShard(const std::vector<int32_t>& local) {
  issued_ = true;
  absl::Status st = IssueShardImpl(local);
  if (!st.ok()) issue_error_ = st;  // Finish reports it (nothing was issued)
  return st;
}

absl::Status UsedMap::IssueShardImpl(const std::vector<int32_t>& local) {
  const auto named = [&](const absl::Status& st) {
    return absl::Status(st.code(), absl::StrCat("used-parameter agreement on group '",
                                                groups_.shard->name(), "': ", st.message()));
  };
  State& s = *state_;
  s.counts = local;
  const size_t n = local.size(), bytes = n * sizeof(int32_t);
  const bool device = !ops_.synchronous();
  void* buf = s.counts.data();
  if (device && n > 0) {
    if (!device_) {
      absl::StatusOr<OwnedBuffer> b = ops_.Allocate(bytes, "used-parameter map");
      if (!b.ok()) return named(b.status());
      device_ = *std::move(b);
    }
    if (absl::Status st = ops_.Copy(device_.get(), s.counts.data(), bytes); !st.ok()) {
      return named(st);
    }
    buf = device_.get();
  }
  CollectiveOptions opts;
  opts.label = "used parameters";
  absl::StatusOr<WorkPtr> w =
      n == 0 ? absl::StatusOr<WorkPtr>(Work::Completed(WorkInfo{}, absl::OkStatus()))
             : groups_.shard->AllReduce(buf, buf, n, DType::kI32, ReduceOp::Sum(), opts);
  if (!w.ok()) return named(w.status());
  shard_work_ = *std::move(w);
  const bool hybrid = config_.mode == ReduceMode::kHybrid;
  if (!device && !hybrid && config_.agree_unused == UnusedAgreement::kDeclared) {
    // The map is final with this all-reduce: readable as soon as it completes.
    std::shared_ptr<State> state = state_;
    WorkPtr agreed = agreed_;
    shard_work_->OnComplete([state, agreed](const absl::Status& st) {
      if (st.ok()) state->Agree();
      agreed->Complete(st);
    });
  }
  return absl::OkStatus();
}

absl::Status UsedMap::Finish(absl::Time deadline, bool issue) {
  if (!agreeing_) return absl::OkStatus();
  agreeing_ = false;
  const auto clear = [&] {
    for (size_t i = 0; i < window_size_; ++i) window_[i].store(0, std::memory_order_relaxed);
  };
  if (config_.static_graph && agreed_once_) {
    clear();
    return absl::OkStatus();
  }
  if (!issue) {
    clear();
    agreed_->Complete(absl::AbortedError("the backward failed: no used-parameter agreement"));
    return absl::OkStatus();
  }
  absl::Status st = issue_error_;  // a declared issue that failed: nothing to wait for
  if (!issued_) {
    std::vector<int32_t> local(window_size_);
    for (size_t i = 0; i < window_size_; ++i) local[i] = window_[i].load(std::memory_order_relaxed);
    st = IssueShard(local);
  }
  clear();
  const bool device = !ops_.synchronous();
  const bool hybrid = config_.mode == ReduceMode::kHybrid;
  if (st.ok() && !device && !hybrid && config_.agree_unused == UnusedAgreement::kDeclared) {
    st = agreed_->WaitUntil(deadline);  // the completion callback agreed (or failed)
    if (st.ok()) agreed_once_ = true;
    return st;
  }
  const size_t n = window_size_, bytes = n * sizeof(int32_t);
  if (st.ok()) st = shard_work_->WaitUntil(deadline);
  BufferOps& last_ops = hybrid ? groups_.replica->buffer_ops() : ops_;
  if (st.ok() && hybrid && n > 0) {
    void* buf = device ? device_.get() : static_cast<void*>(state_->counts.data());
    if (device) st = last_ops.WaitFor(shard_work_->device_event());
    CollectiveOptions opts;
    opts.label = "used parameters";
    absl::StatusOr<WorkPtr> w =
        st.ok() ? groups_.replica->AllReduce(buf, buf, n, DType::kI32, ReduceOp::Sum(), opts)
                : absl::StatusOr<WorkPtr>(st);
    st = w.ok() ? (*w)->WaitUntil(deadline) : w.status();
    if (!st.ok()) {
      st = absl::Status(st.code(), absl::StrCat("used-parameter agreement on group '",
                                                groups_.replica->name(), "': ", st.message()));
    }
  }
  if (st.ok() && device && n > 0) {
    st = last_ops.Copy(state_->counts.data(), device_.get(), bytes);
    if (st.ok()) st = last_ops.Synchronize(deadline);
    st = WithContext(st, "used-parameter agreement: reading the map back");
  }
  if (st.ok()) {
    state_->Agree();
    agreed_once_ = true;
  }
  agreed_->Complete(st);
  return st;
}

bool UsedMap::used(int i) const { return state_->map[i] != 0; }

const uint8_t* UsedMap::map() const { return state_->map.data(); }

void UsedMap::Remap(const BucketPlan& old_plan) {
  std::vector<uint8_t> bits(window_size_), map(window_size_);
  for (size_t i = 0; i < window_size_; ++i) {
    absl::StatusOr<int> j = old_plan.IndexOf(plan_.params()[i].id);
    bits[i] = j.ok() ? window_[*j].load(std::memory_order_relaxed) : 0;
    map[i] = j.ok() ? state_->map[*j] : 1;
  }
  for (size_t i = 0; i < window_size_; ++i) window_[i].store(bits[i], std::memory_order_relaxed);
  state_->map = std::move(map);
}

}  // namespace braid::sched
