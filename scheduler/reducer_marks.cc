#include "scheduler/reducer_marks.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace braid::sched {

absl::Status ReducerMarks::Check(const std::vector<ParamSpec>& params) {
  for (const ParamSpec& p : params) {
    if (p.marks < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", p.Label(), ": marks per backward must be >= 1 (declared) or ",
                       kCountMarks, " (counted in the first synced backward), got ", p.marks));
    }
  }
  return absl::OkStatus();
}

ReducerMarks::ReducerMarks(const BucketPlan& plan)
    : plan_(plan), state_(new State[plan.params().size()]) {
  for (size_t i = 0; i < plan.params().size(); ++i) {
    state_[i].expected = plan.params()[i].marks;
    state_[i].declared = plan.params()[i].marks != kCountMarks;
  }
}

void ReducerMarks::Begin() {
  for (size_t i = 0; i < plan_.params().size(); ++i) {
    state_[i].count.store(0, std::memory_order_relaxed);
    state_[i].unused.store(false, std::memory_order_relaxed);
  }
}

absl::StatusOr<ReducerMarks::Mark> ReducerMarks::Add(int i, bool launching) {
  State& s = state_[i];
  if (s.unused.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("parameter ", plan_.params()[i].Label(),
                     " was declared unused in this backward (braid_reducer_declare_unused) and "
                     "is reduced as "
                     "zeros; a gradient for it now would be left out"));
  }
  const int index = s.count.fetch_add(1, std::memory_order_acq_rel);
  if (s.expected != kCountMarks && index >= s.expected) {
    s.count.fetch_sub(1, std::memory_order_acq_rel);
    const std::string label = plan_.params()[i].Label();
    if (s.expected == 1 && s.declared) {  // the default: one mark per backward
      return absl::FailedPreconditionError(absl::StrCat(
          "parameter ", label,
          " was already marked ready in this backward (a parameter used several times, e.g. "
          "tied, declares its marks per backward in param_marks, or 0 there to have them "
          "counted)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "parameter ", label, " was marked ready more than its ", s.expected,
        " times in this backward (",
        s.declared ? "declared" : "counted in the first synced backward",
        "): its bucket may already be reduced without this contribution, which is refused"));
  }
  return Mark{index, launching && s.expected != kCountMarks && index == s.expected - 1};
}

void ReducerMarks::Undo(int i) { state_[i].count.fetch_sub(1, std::memory_order_acq_rel); }

absl::StatusOr<ReducerMarks::Settled> ReducerMarks::Settle(int i) {
  State& s = state_[i];
  const int n = s.count.load(std::memory_order_acquire);
  if (s.expected == kCountMarks) {
    s.expected = n;
    return Settled::kLearned;
  }
  if (n == s.expected) return Settled::kComplete;
  return absl::FailedPreconditionError(absl::StrCat(
      "parameter ", plan_.params()[i].Label(), " was marked ready ", n,
      " time(s) in this backward, but ", s.expected, " ",
      s.declared ? "were declared" : "were counted in the first synced backward",
      ": its bucket was not reduced (a count that changes between backwards is an error; a "
      "parameter not used at all is left unmarked and needs allow_unused)"));
}

}  // namespace braid::sched
