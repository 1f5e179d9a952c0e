#include "capi/limits.h"

#include <cmath>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/bucket_plan.h"

namespace braid::capi {

absl::Status CheckHyperFinite(const optim::GroupHyper& h, optim::OptimizerKind kind,
                              absl::string_view prefix) {
  using Field = std::pair<const char*, double>;
  const std::initializer_list<Field> adamw = {{"lr", h.adamw.lr},
                                              {"beta1", h.adamw.beta1},
                                              {"beta2", h.adamw.beta2},
                                              {"eps", h.adamw.eps},
                                              {"weight_decay", h.adamw.weight_decay}};
  const std::initializer_list<Field> sgd = {
      {"lr", h.sgd.lr}, {"momentum", h.sgd.momentum}, {"weight_decay", h.sgd.weight_decay}};
  for (const auto& [name, value] : kind == optim::OptimizerKind::kAdamW ? adamw : sgd) {
    if (!std::isfinite(value)) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, name, " must be finite, got ", value));
    }
  }
  return absl::OkStatus();
}

absl::Status AddParamBytes(size_t count, DType dtype, absl::string_view what, size_t* total_bytes) {
  const size_t es = DTypeSize(dtype);
  if (count > (sched::kMaxPlanBytes - *total_bytes) / es) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is ", count, ": ", count, " x ", es, " bytes (", DTypeName(dtype),
                     ") take the parameters past 2^60 bytes (braid.h: braid_param_t.count)"));
  }
  *total_bytes += count * es;
  return absl::OkStatus();
}

}  // namespace braid::capi
