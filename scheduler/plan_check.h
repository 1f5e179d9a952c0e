// Cross-rank check that every rank built the identical BucketPlan (collective over `group`).
//
//   RETURN_IF_ERROR(VerifyPlanAcrossRanks(plan, *world, absl::Seconds(60)));
//
// One all-gather of (fingerprint, parameter count) when the plans agree (the common case);
// when they do not, a second all-gather of every parameter's (id, count, dtype, device) finds
// the first parameter that differs, and every rank fails with the same message naming it and
// the ranks that disagree. A rank whose plan differs would otherwise hang its peers at the
// first mismatched collective.
#ifndef BRAID_SCHEDULER_PLAN_CHECK_H_
#define BRAID_SCHEDULER_PLAN_CHECK_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "scheduler/bucket_plan.h"

namespace braid::sched {

absl::Status VerifyPlanAcrossRanks(const BucketPlan& plan, Group& group, absl::Duration timeout);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_PLAN_CHECK_H_
