// Reduction operators.
//
//   ReduceOp op = ReduceOp::Sum();
//   ReduceOp avg = ReduceOp::Avg();                 // sum, then divide by the group size
//   ReduceOp pre = ReduceOp::PreMulSum(1.0 / 8);    // sum of (scalar * x_i)
//   RETURN_IF_ERROR(ValidateReduceOp(op, DType::kBF16));
//
// Semantics, the same on every backend (the serial reference in tests/ spells them out):
//   sum:         acc = x_0 + x_1 + ... in the accumulation type (f32 for bf16/f16)
//   avg:         acc / n                     (floating dtypes only)
//   premul_sum:  (s_0*x_0) + (s_1*x_1) + ...  (floating dtypes only; s_r is rank r's own
//                ReduceOp::scalar, as NCCL's per-rank premul scalar; finite)
//   max / min:   element-wise in rank order, acc = x_k > acc ? x_k : acc; any dtype. A NaN
//                wins only where it is first in rank order: don't rely on NaN propagation.
#ifndef BRAID_COMM_REDUCE_OP_H_
#define BRAID_COMM_REDUCE_OP_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "comm/dtype.h"

namespace braid {

enum class ReduceKind : int { kSum = 0, kAvg = 1, kPreMulSum = 2, kMax = 3, kMin = 4 };

inline constexpr ReduceKind kAllReduceKinds[] = {
    ReduceKind::kSum, ReduceKind::kAvg, ReduceKind::kPreMulSum, ReduceKind::kMax, ReduceKind::kMin};

struct ReduceOp {
  ReduceKind kind = ReduceKind::kSum;
  double scalar = 1.0;  // used by kPreMulSum only

  static ReduceOp Sum() { return {ReduceKind::kSum, 1.0}; }
  static ReduceOp Avg() { return {ReduceKind::kAvg, 1.0}; }
  static ReduceOp PreMulSum(double s) { return {ReduceKind::kPreMulSum, s}; }
  static ReduceOp Max() { return {ReduceKind::kMax, 1.0}; }
  static ReduceOp Min() { return {ReduceKind::kMin, 1.0}; }
};

absl::string_view ReduceKindName(ReduceKind k);  // "sum", "avg", "premul_sum", "max", "min"
std::string ReduceOpName(const ReduceOp& op);    // e.g. "premul_sum(0.125)"
absl::StatusOr<ReduceKind> ParseReduceKind(absl::string_view name);

// OK when `op` is meaningful for `dtype`; else InvalidArgument naming both.
absl::Status ValidateReduceOp(const ReduceOp& op, DType dtype);

}  // namespace braid

#endif  // BRAID_COMM_REDUCE_OP_H_
