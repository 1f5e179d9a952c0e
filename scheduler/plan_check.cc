#include "scheduler/plan_check.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/host_values.h"
#include "comm/status_macros.h"

namespace braid::sched {
namespace {

// Through comm/host_values.h: a failed wait never leaves the all-gather reading freed memory.
absl::Status AllGatherI64(Group& g, const std::vector<int64_t>& mine, std::vector<int64_t>* all,
                          absl::Duration timeout) {
  all->assign(mine.size() * static_cast<size_t>(g.size()), 0);
  return AllGatherHostValues(g, mine.data(), all->data(), mine.size(), DType::kI64,
                             "bucket plan check", absl::Now() + timeout);
}

std::string Describe(const int64_t* spec) {
  return absl::StrCat("id ", spec[0], ", ", spec[1], " x ",
                      IsValidDType(static_cast<int>(spec[2]))
                          ? DTypeName(static_cast<DType>(spec[2]))
                          : absl::string_view("?"),
                      spec[3] == 0 ? " on cpu" : absl::StrCat(" on cuda:", spec[4]));
}

}  // namespace

absl::Status VerifyPlanAcrossRanks(const BucketPlan& plan, Group& group, absl::Duration timeout) {
  const int n = group.size();
  const auto& params = plan.params();
  std::vector<int64_t> all;
  RETURN_IF_ERROR(AllGatherI64(
      group, {static_cast<int64_t>(plan.Fingerprint()), static_cast<int64_t>(params.size())}, &all,
      timeout));
  int differing = -1;
  for (int r = 1; r < n && differing < 0; ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) differing = r;
  }
  if (differing < 0) return absl::OkStatus();
  if (all[2 * differing + 1] != all[1]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket plans differ across ranks of group '", group.name(), "': rank 0 registered ",
        all[1], " parameters, rank ", differing, " registered ", all[2 * differing + 1]));
  }
  // Same count: find the first parameter whose spec differs.
  constexpr int kFields = 5;
  std::vector<int64_t> mine;
  for (const ParamSpec& p : params) {
    mine.insert(mine.end(), {p.id, static_cast<int64_t>(p.count), static_cast<int64_t>(p.dtype),
                             static_cast<int64_t>(p.device.type), p.device.index});
  }
  RETURN_IF_ERROR(AllGatherI64(group, mine, &all, timeout));
  const size_t stride = mine.size();
  for (size_t i = 0; i < params.size(); ++i) {
    for (int r = 1; r < n; ++r) {
      const int64_t* a = &all[i * kFields];
      const int64_t* b = &all[r * stride + i * kFields];
      if (!std::equal(a, a + kFields, b)) {
        return absl::FailedPreconditionError(
            absl::StrCat("bucket plans differ across ranks of group '", group.name(),
                         "': parameter #", i, " (here ", params[i].Label(), ") is ", Describe(a),
                         " on rank 0 but ", Describe(b), " on rank ", r));
      }
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "bucket plans differ across ranks of group '", group.name(), "' (rank ", differing,
      "): the parameters match, so the plan options (bucket caps, shards, alignment) or the "
      "bucket order differ"));
}

absl::Status VerifyOptionsAcrossRanks(absl::string_view what,
                                      const std::vector<NamedOption>& options, Group& group,
                                      absl::Duration timeout) {
  const int n = group.size();
  if (n <= 1 || options.empty()) return absl::OkStatus();
  std::vector<int64_t> mine;
  for (const NamedOption& o : options) mine.push_back(o.value);
  std::vector<int64_t> all;
  RETURN_IF_ERROR(AllGatherI64(group, mine, &all, timeout));
  const size_t k = options.size();
  for (size_t i = 0; i < k; ++i) {
    bool same = true;
    for (int r = 1; r < n && same; ++r) same = all[r * k + i] == all[i];
    if (same) continue;
    std::vector<std::string> each;
    constexpr int kListed = 8;
    for (int r = 0; r < n && r < kListed; ++r) {
      each.push_back(absl::StrCat(all[r * k + i], " on rank ", r));
    }
    if (n > kListed) each.push_back(absl::StrCat("(", n - kListed, " more ranks)"));
    return absl::FailedPreconditionError(absl::StrCat(what, " differ across the ranks of group '",
                                                      group.name(), "': ", options[i].name, " is ",
                                                      absl::StrJoin(each, ", ")));
  }
  return absl::OkStatus();
}

}  // namespace braid::sched
