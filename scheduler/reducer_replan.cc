// GradientReducer's plan changes between steps (declared in gradient_reducer.h): the one-time
// bucket-order rebuild (RebuildBucketsIfPending), new caps (Replan), and what both share
// (AdoptPlan: the plan checked across ranks, new storage, every gradient moved to its slot).
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/host_values.h"
#include "comm/status_macros.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/plan_check.h"
#include "scheduler/reducer_stages.h"
#include "scheduler/reducer_storage.h"

namespace braid::sched {

bool GradientReducer::RebuildPending() const {
  return rebuild_pending_ && !recording_.load() && ready_count_.load() > 0;
}

absl::StatusOr<bool> GradientReducer::RebuildBucketsIfPending() {
  if (in_backward_.load()) {
    return absl::FailedPreconditionError("rebuilding the buckets during a backward");
  }
  if (!RebuildPending()) return false;
  // Refused before the broadcast, not after it in AdoptPlan (peers would wait in the plan check).
  RETURN_IF_ERROR(stages_->NoneInFlight("rebuilding the buckets"));
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
    RETURN_IF_ERROR(BroadcastHostValues(*g, order.data(), order.size(), DType::kI64, 0,
                                        "bucket order rebuild", absl::Now() + config_.timeout));
  }
  std::vector<int> new_order(order.begin(), order.end());
  ASSIGN_OR_RETURN(BucketPlan plan,
                   BucketPlan::BuildInOrder(plan_.params(), new_order, plan_.options()));
  RETURN_IF_ERROR(AdoptPlan(std::move(plan)));
  rebuild_pending_ = false;
  return true;
}

absl::Status GradientReducer::AdoptPlan(BucketPlan plan) {
  RETURN_IF_ERROR(stages_->NoneInFlight("re-planning the buckets"));
  const int partial = stages_->FirstPartial();
  if (partial >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "re-planning the buckets: bucket ", partial,
        " holds a reduce_scatter_only partial sum (per bucket); finish the window first"));
  }
  std::vector<Group*> chain = {groups_.shard};
  if (config_.mode == ReduceMode::kHybrid) chain.push_back(groups_.replica);
  for (Group* g : chain) RETURN_IF_ERROR(VerifyPlanAcrossRanks(plan, *g, config_.timeout));
  const int n = static_cast<int>(plan_.params().size());
  // Move every gradient to its new slot. The storage reads bucket sizes from plan_ (stable
  // address); the old storage is only read through Data(), which does not.
  BucketPlan old_plan = std::move(plan_);
  plan_ = std::move(plan);
  std::unique_ptr<BucketStorage> fresh = storage_->Fresh();
  if (absl::Status st = fresh->Allocate(plan_); !st.ok()) {
    plan_ = std::move(old_plan);  // nothing changed
    return st;
  }
  std::unique_ptr<BucketStorage> old_storage = std::move(storage_);
  storage_ = std::move(fresh);
  // A rebuild in the order the buckets already have (torch's policy on a model whose readiness
  // order is the registration order reversed) keeps a comm hook's per-bucket state.
  stages_->Reset(*storage_, plan_.Fingerprint() != old_plan.Fingerprint());
  used_->Remap(old_plan);
  for (int i = 0; i < n; ++i) {
    const ParamSpec& p = plan_.params()[i];
    const size_t es = DTypeSize(p.dtype);
    RETURN_IF_ERROR(ops_.Copy(
        storage_->Data(plan_.slot(i).bucket) + plan_.slot(i).offset * es,
        old_storage->Data(old_plan.slot(i).bucket) + old_plan.slot(i).offset * es, p.count * es));
  }
  // The old storage is freed on return: the copies out of it must have run.
  RETURN_IF_ERROR(ops_.Synchronize(absl::Now() + config_.timeout));
  ++plan_generation_;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<BucketPlan>> GradientReducer::PlanForCaps(
    size_t bucket_cap_bytes, size_t first_bucket_cap_bytes) const {
  if (bucket_cap_bytes == 0 || first_bucket_cap_bytes == 0) {
    return absl::InvalidArgumentError("re-plan: bucket caps must be positive");
  }
  const PlanOptions& cur = plan_.options();
  if (cur.bucket_cap_bytes == bucket_cap_bytes &&
      cur.first_bucket_cap_bytes == first_bucket_cap_bytes)
    return std::nullopt;
  PlanOptions po = cur;
  po.bucket_cap_bytes = bucket_cap_bytes;
  po.first_bucket_cap_bytes = first_bucket_cap_bytes;
  std::vector<int> order;  // the current order: bucket by bucket
  for (const Bucket& bk : plan_.buckets())
    order.insert(order.end(), bk.params.begin(), bk.params.end());
  ASSIGN_OR_RETURN(BucketPlan plan, BucketPlan::BuildInOrder(plan_.params(), order, po));
  // The same buckets (identical on every rank: plan data only).
  if (plan.Fingerprint() == plan_.Fingerprint()) return std::nullopt;
  return plan;
}

absl::StatusOr<bool> GradientReducer::ReplanChanges(size_t bucket_cap_bytes,
                                                    size_t first_bucket_cap_bytes) const {
  ASSIGN_OR_RETURN(std::optional<BucketPlan> plan,
                   PlanForCaps(bucket_cap_bytes, first_bucket_cap_bytes));
  return plan.has_value();
}

absl::StatusOr<bool> GradientReducer::Replan(size_t bucket_cap_bytes,
                                             size_t first_bucket_cap_bytes) {
  if (in_backward_.load()) return absl::FailedPreconditionError("re-plan during a backward");
  RETURN_IF_ERROR(storage_->CheckReplan());
  const PlanOptions& cur = plan_.options();
  const bool same_caps = cur.bucket_cap_bytes == bucket_cap_bytes &&
                         cur.first_bucket_cap_bytes == first_bucket_cap_bytes;
  ASSIGN_OR_RETURN(std::optional<BucketPlan> plan,
                   PlanForCaps(bucket_cap_bytes, first_bucket_cap_bytes));
  if (plan.has_value()) RETURN_IF_ERROR(AdoptPlan(*std::move(plan)));
  if (plan.has_value() || !same_caps) {  // the same buckets under new caps: the caps recorded
    config_.bucket_cap_bytes = bucket_cap_bytes;
    config_.first_bucket_cap_bytes = first_bucket_cap_bytes;
  }
  return plan.has_value();
}

}  // namespace braid::sched
