#include "optim/linked_optimizers.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "optim/global_norm.h"

namespace braid::optim {

namespace {

// The options every member's step decision depends on agree with member 0's.
absl::Status CheckAgreement(const std::vector<LinkedMember>& members) {
  for (size_t m = 0; m < members.size(); ++m) {
    if (!members[m].options.optimizer.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "linked optimizers: reducer ", m, " has no optimizer (kind NONE steps nothing)"));
    }
    const OptimizerConfig& a = *members[0].options.optimizer;
    const OptimizerConfig& b = *members[m].options.optimizer;
    const char* differs = a.max_grad_norm != b.max_grad_norm       ? "max_grad_norm"
                          : a.skip_nonfinite != b.skip_nonfinite   ? "skip_nonfinite"
                          : a.track_grad_norm != b.track_grad_norm ? "track_grad_norm"
                                                                   : nullptr;
    if (differs != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("linked optimizers: reducer ", m,
                                                     " and reducer 0 differ in ", differs,
                                                     " (one norm makes one decision)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AddLinkedParamSides(const std::vector<LinkedMember>& members, Group& span,
                                 Group* tensor_parallel) {
  if (members.empty()) return absl::InvalidArgumentError("linked optimizers: no reducer");
  RETURN_IF_ERROR(CheckAgreement(members));
  std::vector<GlobalNorm::Member> specs;
  bool on_device = false;
  for (size_t m = 0; m < members.size(); ++m) {
    TrainingStack* s = members[m].stack;
    if (s == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("linked optimizers: reducer ", m, " is null"));
    }
    if (s->has_param_side()) {
      return absl::FailedPreconditionError(
          absl::StrCat("linked optimizers: reducer ", m, " already has an optimizer"));
    }
    for (size_t k = 0; k < m; ++k) {
      if (members[k].stack == s) {
        return absl::InvalidArgumentError(absl::StrCat("linked optimizers: reducer ", m,
                                                       " is also reducer ", k, " (give it once)"));
      }
    }
    if (s->on_device() != members[0].stack->on_device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "linked optimizers: reducer ", m, " and reducer 0 are not both on the host or a device"));
    }
    on_device = s->on_device();
    specs.push_back(GlobalNorm::Member{s->reducer().groups(), members[m].tp_replicated});
  }
  ASSIGN_OR_RETURN(std::shared_ptr<GlobalNorm> norm,
                   GlobalNorm::Create(span, tensor_parallel, std::move(specs), on_device,
                                      &members[0].stack->memory()));
  for (size_t m = 0; m < members.size(); ++m) {
    ParamOptions po = members[m].options;
    po.optimizer->global_norm = norm;
    po.optimizer->norm_member = static_cast<int>(m);
    absl::Status s = members[m].stack->AddParamSide(po);
    if (!s.ok()) {
      for (size_t k = 0; k < m; ++k) members[k].stack->DropParamSide();
      return WithContext(s, absl::StrCat("linked optimizers: the optimizer of reducer ", m));
    }
  }
  return absl::OkStatus();
}

}  // namespace braid::optim
