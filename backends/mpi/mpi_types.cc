#include "backends/mpi/mpi_types.h"

#include <cstdint>

#include "backends/mpi/mpi_errors.h"
#include "comm/check.h"
#include "comm/reduce_kernels.h"

namespace braid::mpi {
namespace {

// inout[i] = in[i] + inout[i] modulo 256.
void WrappingU8Sum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint8_t*>(in);
  auto* b = static_cast<uint8_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = static_cast<uint8_t>(a[i] + b[i]);
}

// inout[i] = half(f32(in[i]) + f32(inout[i])), rounded to nearest even (comm's ReduceInto
// of two inputs: f32 accumulation, narrowed once).
template <DType kHalf>
void HalfSum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const void* inputs[] = {in, inout};
  ReduceInto(inputs, 2, inout, static_cast<size_t>(*len), kHalf, ReduceOp::Sum(), 2);
}

}  // namespace

MPI_Datatype MpiDatatype(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kF64:
      return MPI_DOUBLE;
    case DType::kBF16:
      return MPI_UINT16_T;
    case DType::kF16:
      return MPI_UINT16_T;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kI64:
      return MPI_INT64_T;
    case DType::kU8:
      return MPI_UINT8_T;
  }
  BRAID_CHECK(false && "MpiDatatype: invalid dtype");
  return MPI_DATATYPE_NULL;
}

absl::StatusOr<std::unique_ptr<MpiOps>> MpiOps::Create() {
  std::unique_ptr<MpiOps> ops(new MpiOps());
  RETURN_IF_MPI_ERROR(MPI_Op_create(&WrappingU8Sum, /*commute=*/1, &ops->wrapping_u8_sum_));
  RETURN_IF_MPI_ERROR(MPI_Op_create(&HalfSum<DType::kBF16>, /*commute=*/1, &ops->bf16_sum_));
  RETURN_IF_MPI_ERROR(MPI_Op_create(&HalfSum<DType::kF16>, /*commute=*/1, &ops->f16_sum_));
  return ops;
}

MpiOps::~MpiOps() {
  for (MPI_Op* op : {&wrapping_u8_sum_, &bf16_sum_, &f16_sum_}) {
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }
}

MPI_Op MpiOps::For(ReduceKind k, DType wire) const {
  switch (k) {
    case ReduceKind::kMax:
      return MPI_MAX;
    case ReduceKind::kMin:
      return MPI_MIN;
    case ReduceKind::kSum:
      if (wire == DType::kBF16) return bf16_sum_;
      if (wire == DType::kF16) return f16_sum_;
      return wire == DType::kU8 ? wrapping_u8_sum_ : MPI_SUM;
    default:
      break;
  }
  BRAID_CHECK(false && "MpiOps::For: only sum, max and min are MPI ops here");
  return MPI_OP_NULL;
}

}  // namespace braid::mpi
