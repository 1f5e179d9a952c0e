// Braid's vocabulary mapped to NCCL's: data types, reduce ops, and the pre-mul-sum scalar.
//
//   ncclDataType_t t = ToNcclType(DType::kBF16);                 // ncclBfloat16
//   ReductionChoice c = ChooseReduction(ReduceOp::Avg(), DType::kF32, /*nranks=*/8);
//   // c.builtin = ncclAvg, c.premul = false
//
// Choices (FSDP2's, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py):
//   sum, max, min     -> ncclSum, ncclMax, ncclMin
//   avg               -> ncclAvg; ncclSum at group size 1 (avg over one rank is the identity,
//                        and NCCL's AVG has been wrong there)
//   premul_sum(s)     -> ncclRedOpCreatePreMulSum with s as a host-immediate scalar of the data
//                        type (so for bf16/f16 the scalar itself is rounded to bf16/f16 first,
//                        as NCCL defines it). The op is created per launch and destroyed right
//                        after the call that used it returns (PreMulSumOp, nccl_comm.h).
// The f16 sqrt(N) pre/post-divide split is the scheduler's (scheduler/divide.h): it arrives
// here as premul_sum(1/pre) and a post-divide the scheduler applies.
#ifndef BRAID_BACKENDS_NCCL_NCCL_TYPES_H_
#define BRAID_BACKENDS_NCCL_NCCL_TYPES_H_

#include <nccl.h>

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "comm/dtype.h"
#include "comm/reduce_op.h"

namespace braid::nccl {

// Every DType has an NCCL type (u8 -> ncclUint8, i32 -> ncclInt32, ...).
ncclDataType_t ToNcclType(DType t);

struct ReductionChoice {
  ncclRedOp_t builtin = ncclSum;  // used when !premul
  bool premul = false;            // create a pre-mul-sum op with `scalar`
  double scalar = 1.0;
};
// InvalidArgument naming op and dtype when NCCL cannot express it (avg/premul on integers).
absl::StatusOr<ReductionChoice> ChooseReduction(const ReduceOp& op, DType dtype, int nranks);

// `value` encoded as one element of `dtype` (f32, f64, bf16, f16; round to nearest even), as
// ncclRedOpCreatePreMulSum reads a host-immediate scalar. InvalidArgument for integer dtypes.
struct ScalarBytes {
  std::array<uint8_t, 8> bytes{};
};
absl::StatusOr<ScalarBytes> EncodeScalar(double value, DType dtype);
// The inverse (for fakes and tests): the scalar NCCL will multiply by, as a double.
double DecodeScalar(const void* bytes, ncclDataType_t type);

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_NCCL_TYPES_H_
