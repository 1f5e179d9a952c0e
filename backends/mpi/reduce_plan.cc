#include "backends/mpi/reduce_plan.h"

namespace braid::mpi {

ReducePlan PlanReduce(DType dtype, const ReduceOp& op, int group_size, bool half_wire) {
  ReducePlan p;
  const bool two_byte_wire =
      IsHalf(dtype) && half_wire && op.kind != ReduceKind::kMax && op.kind != ReduceKind::kMin;
  p.wire = IsHalf(dtype) && !two_byte_wire ? DType::kF32 : dtype;
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
  if (IsHalf(dtype) && !two_byte_wire) {
    p.stage_input = true;
    p.narrow_output = true;
  }
  return p;
}

}  // namespace braid::mpi
