#include "comm/reduce_op.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace braid {

absl::string_view ReduceKindName(ReduceKind k) {
  switch (k) {
    case ReduceKind::kSum:
      return "sum";
    case ReduceKind::kAvg:
      return "avg";
    case ReduceKind::kPreMulSum:
      return "premul_sum";
    case ReduceKind::kMax:
      return "max";
    case ReduceKind::kMin:
      return "min";
  }
  return "invalid-op";
}

std::string ReduceOpName(const ReduceOp& op) {
  if (op.kind == ReduceKind::kPreMulSum) return absl::StrCat("premul_sum(", op.scalar, ")");
  return std::string(ReduceKindName(op.kind));
}

absl::StatusOr<ReduceKind> ParseReduceKind(absl::string_view name) {
  for (ReduceKind k : kAllReduceKinds) {
    if (ReduceKindName(k) == name) return k;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reduce op '", name, "' (expected sum, avg, premul_sum, max, min)"));
}

absl::Status ValidateReduceOp(const ReduceOp& op, DType dtype) {
  const int raw = static_cast<int>(op.kind);
  if (raw < 0 || raw > static_cast<int>(ReduceKind::kMin)) {
    return absl::InvalidArgumentError(absl::StrCat("invalid reduce op value ", raw));
  }
  if ((op.kind == ReduceKind::kAvg || op.kind == ReduceKind::kPreMulSum) && !IsFloating(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce op ", ReduceKindName(op.kind), " is not defined for integer dtype ",
                     DTypeName(dtype), ": use sum and divide in the caller, or a floating dtype"));
  }
  if (op.kind == ReduceKind::kPreMulSum && !std::isfinite(op.scalar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("premul_sum scalar must be finite, got ", op.scalar));
  }
  return absl::OkStatus();
}

}  // namespace braid
