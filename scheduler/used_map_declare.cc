// GradientReducer's side of the used-map agreement (scheduler/used_map.h): the framework's
// declaration of the parameters it will not mark, and the agreed map by id.
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/reducer_marks.h"
#include "scheduler/reducer_stages.h"
#include "scheduler/user_calls.h"

namespace braid::sched {

absl::Status GradientReducer::DeclareUnused(const std::vector<ParamId>& ids) {
  if (!Declares(config_.agree_unused)) {
    return absl::FailedPreconditionError(
        "needs agree_unused = declared or declared_at_finish (the reducer takes declarations "
        "only then)");
  }
  if (!in_backward_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("outside a backward: call ", kBeginBackward, " first"));
  }
  if (declared_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError("called twice in one backward");
  }
  const size_t n = plan_.params().size();
  for (size_t i = 0; i < n; ++i) {
    if (marks_->count(static_cast<int>(i)) > 0) {
      // A bucket may have launched already: the agreement would not come first on this rank.
      return absl::FailedPreconditionError(
          absl::StrCat("after parameter ", plan_.params()[i].Label(),
                       " was marked ready: declare before the first mark of the backward"));
    }
  }
  std::vector<uint8_t> declared(n, 0);
  for (ParamId id : ids) {
    absl::StatusOr<int> i = plan_.IndexOf(id);
    if (!i.ok()) return absl::NotFoundError(absl::StrCat("unknown parameter id ", id));
    if (declared[*i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", plan_.params()[*i].Label(), " listed twice"));
    }
    declared[*i] = 1;
  }
  if (sync_ == SyncMode::kNoSync) {  // nothing is reduced now
    declared_.store(true, std::memory_order_release);
    return absl::OkStatus();
  }
  // Marked before any MarkReady is accepted: a later mark of a declared parameter is an error.
  for (size_t i = 0; i < n; ++i) {
    if (declared[i]) marks_->SetUnused(static_cast<int>(i));
  }
  declared_.store(true, std::memory_order_release);
  // First the agreement (kDeclared: the shard group's first collective of this backward;
  // kDeclaredAtFinish: nothing now), then the declared parameters, which may launch buckets.
  RETURN_IF_ERROR(used_->IssueDeclared(declared));
  for (size_t i = 0; i < n; ++i) {
    if (declared[i]) ReduceUnmarked(static_cast<int>(i), "braid_reducer_declare_unused");
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> GradientReducer::Used(ParamId id) const {
  ASSIGN_OR_RETURN(int i, plan_.IndexOf(id));
  return used_->used(i);
}

}  // namespace braid::sched
