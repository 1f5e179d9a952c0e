// GradientReducer::Replan (declared in gradient_reducer.h): kept out of gradient_reducer.cc,
// which is long enough.
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/plan_check.h"
#include "scheduler/reducer_bucket_state.h"

namespace braid::sched {

absl::StatusOr<bool> GradientReducer::Replan(size_t bucket_cap_bytes, size_t first_bucket_cap_bytes) {
  if (in_backward_.load()) return absl::FailedPreconditionError("Replan during a backward");
  if (config_.keep_shards_only) {
    return absl::FailedPreconditionError(
        "Replan with keep_shards_only: buckets hold no full-size storage to move gradients through");
  }
  if (bucket_cap_bytes == 0 || first_bucket_cap_bytes == 0) {
    return absl::InvalidArgumentError("Replan: bucket caps must be positive");
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b]->has_partial) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Replan: ", buckets_[b]->label, " holds a reduce_scatter_only partial sum; finish the window first"));
    }
  }
  const PlanOptions& cur = plan_.options();
  if (cur.bucket_cap_bytes == bucket_cap_bytes && cur.first_bucket_cap_bytes == first_bucket_cap_bytes) return false;
  PlanOptions po = cur;
  po.bucket_cap_bytes = bucket_cap_bytes;
  po.first_bucket_cap_bytes = first_bucket_cap_bytes;
  std::vector<int> order;  // the current order: bucket by bucket
  for (const Bucket& bk : plan_.buckets()) order.insert(order.end(), bk.params.begin(), bk.params.end());
  ASSIGN_OR_RETURN(BucketPlan plan, BucketPlan::BuildInOrder(plan_.params(), order, po));
  RETURN_IF_ERROR(VerifyPlanAcrossRanks(plan, *groups_.shard, config_.timeout));
  if (config_.mode == ReduceMode::kHybrid) RETURN_IF_ERROR(VerifyPlanAcrossRanks(plan, *groups_.replica, config_.timeout));
  BucketPlan old_plan = std::move(plan_);
  std::vector<std::unique_ptr<BucketState>> old_buckets = std::move(buckets_);
  plan_ = std::move(plan);
  RETURN_IF_ERROR(AllocateBuckets());
  for (size_t i = 0; i < plan_.params().size(); ++i) {
    const ParamSpec& p = plan_.params()[i];
    const size_t es = DTypeSize(p.dtype);
    const int k = static_cast<int>(i);
    RETURN_IF_ERROR(ops_.Copy(BucketData(plan_.slot(k).bucket) + plan_.slot(k).offset * es,
                              old_buckets[old_plan.slot(k).bucket]->data.get() + old_plan.slot(k).offset * es,
                              p.count * es));
  }
  // The old storage is freed on return: the copies out of it must have run.
  RETURN_IF_ERROR(ops_.Synchronize(absl::Now() + config_.timeout));
  config_.bucket_cap_bytes = bucket_cap_bytes;
  config_.first_bucket_cap_bytes = first_bucket_cap_bytes;
  ++plan_generation_;
  return true;
}

}  // namespace braid::sched
