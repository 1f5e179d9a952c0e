#include "backends/nccl/nccl_types.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "comm/half.h"
#include "comm/status_macros.h"

namespace braid::nccl {

ncclDataType_t ToNcclType(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
      return ncclUint8;
  }
  return ncclNumTypes;  // unreachable for validated dtypes; NCCL rejects it
}

absl::StatusOr<ReductionChoice> ChooseReduction(const ReduceOp& op, DType dtype, int nranks) {
  RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  ReductionChoice c;
  switch (op.kind) {
    case ReduceKind::kSum:
      c.builtin = ncclSum;
      break;
    case ReduceKind::kMax:
      c.builtin = ncclMax;
      break;
    case ReduceKind::kMin:
      c.builtin = ncclMin;
      break;
    case ReduceKind::kAvg:
      c.builtin = nranks == 1 ? ncclSum : ncclAvg;
      break;
    case ReduceKind::kPreMulSum:
      c.premul = true;
      c.scalar = op.scalar;
      break;
  }
  return c;
}

absl::StatusOr<ScalarBytes> EncodeScalar(double value, DType dtype) {
  ScalarBytes s;
  switch (dtype) {
    case DType::kF32: {
      const float f = static_cast<float>(value);
      std::memcpy(s.bytes.data(), &f, sizeof f);
      return s;
    }
    case DType::kF64:
      std::memcpy(s.bytes.data(), &value, sizeof value);
      return s;
    case DType::kBF16: {
      const BF16 h = ToBF16(static_cast<float>(value));
      std::memcpy(s.bytes.data(), &h.bits, 2);
      return s;
    }
    case DType::kF16: {
      const F16 h = ToF16(static_cast<float>(value));
      std::memcpy(s.bytes.data(), &h.bits, 2);
      return s;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("pre-multiplied sum scalar: no NCCL scalar for dtype ", DTypeName(dtype)));
  }
}

double DecodeScalar(const void* bytes, ncclDataType_t type) {
  switch (type) {
    case ncclFloat32: {
      float f;
      std::memcpy(&f, bytes, sizeof f);
      return f;
    }
    case ncclFloat64: {
      double d;
      std::memcpy(&d, bytes, sizeof d);
      return d;
    }
    case ncclBfloat16: {
      BF16 h;
      std::memcpy(&h.bits, bytes, 2);
      return ToFloat(h);
    }
    case ncclFloat16: {
      F16 h;
      std::memcpy(&h.bits, bytes, 2);
      return ToFloat(h);
    }
    default:
      return 0.0;
  }
}

}  // namespace braid::nccl
