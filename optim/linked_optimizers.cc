#include "optim/linked_optimizers.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "optim/global_norm.h"

namespace braid::optim {

absl::Status AddLinkedParamSides(const std::vector<LinkedMember>& members, Group& span,
                                 Group* tensor_parallel, const ParamOptions& options) {
  if (!options.optimizer.has_value()) {
    return absl::InvalidArgumentError(
        "linked optimizers: a global norm needs an optimizer (kind NONE steps nothing)");
  }
  if (members.empty()) return absl::InvalidArgumentError("linked optimizers: no reducer");
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
    ParamOptions po = options;
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
