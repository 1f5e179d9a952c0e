// Cross-rank check that every rank built the identical BucketPlan (collective over `group`).
//
//   RETURN_IF_ERROR(VerifyPlanAcrossRanks(plan, *world, absl::Seconds(60)));
//
// One all-gather of (fingerprint, parameter count) when the plans agree (the common case);
// when they do not, a second all-gather of every parameter's (id, count, dtype, device) finds
// the first parameter that differs, and every rank fails with the same message naming it and
// the ranks that disagree. A rank whose plan differs would otherwise hang its peers at the
// first mismatched collective.
//
// VerifyOptionsAcrossRanks does the same for options every rank must pass alike (a reducer's
// mode, caps, credit_bytes, priorities, ...): one all-gather of their values, and on a mismatch
// every rank fails naming the first option that differs and each rank's value of it. Run it
// before anything whose collectives depend on those options (a launch scheduler that only some
// ranks create would otherwise pair its collectives with another rank's plan check, and the
// error would describe that instead).
#ifndef BRAID_SCHEDULER_PLAN_CHECK_H_
#define BRAID_SCHEDULER_PLAN_CHECK_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "scheduler/bucket_plan.h"

namespace braid::sched {

absl::Status VerifyPlanAcrossRanks(const BucketPlan& plan, Group& group, absl::Duration timeout);

struct NamedOption {
  const char* name;  // as the caller wrote it ("credit_bytes")
  int64_t value;
};
// FailedPrecondition "<what> differ across the ranks of group 'world': credit_bytes is 1048576
// on rank 0, 0 on rank 1" (every rank's value; at most 8 listed, then the count of the rest).
absl::Status VerifyOptionsAcrossRanks(absl::string_view what,
                                      const std::vector<NamedOption>& options, Group& group,
                                      absl::Duration timeout);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_PLAN_CHECK_H_
