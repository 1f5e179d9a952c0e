#include "backends/mpi/reduce_plan.h"

namespace braid::mpi {

ReducePlan PlanReduce(DType dtype, const ReduceOp& op, int group_size) {
  ReducePlan p;
  p.wire = IsHalf(dtype) ? DType::kF32 : dtype;
  switch (op.kind) {
    case ReduceKind::kMax:
    case ReduceKind::kMin:
      p.mpi_op = op.kind;
      break;
    case ReduceKind::kAvg:
      p.mpi_op = ReduceKind::kSum;
      p.divide_by = group_size;
      break;
    case ReduceKind::kPreMulSum:
      p.mpi_op = ReduceKind::kSum;
      p.stage_input = true;
      p.input_scale = ScaleSpec{true, op.scalar, 0};
      break;
    case ReduceKind::kSum:
      p.mpi_op = ReduceKind::kSum;
      break;
  }
  if (IsHalf(dtype)) {
    p.stage_input = true;
    p.narrow_output = true;
  }
  return p;
}

}  // namespace braid::mpi
