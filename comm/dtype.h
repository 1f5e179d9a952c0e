// Element types Braid moves and reduces.
//
//   DType t = DType::kBF16;
//   size_t bytes = count * DTypeSize(t);           // 2 bytes per element
//   absl::StatusOr<DType> p = ParseDType("bf16");  // names as DTypeName prints them
//
// bf16 and f16 are reduced with f32 accumulation (see half.h); integer sums wrap modulo 2^bits.
#ifndef BRAID_COMM_DTYPE_H_
#define BRAID_COMM_DTYPE_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid {

enum class DType : int {
  kF32 = 0,
  kF64 = 1,
  kBF16 = 2,
  kF16 = 3,
  kI32 = 4,
  kI64 = 5,
  kU8 = 6,
};

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                                       DType::kI32, DType::kI64, DType::kU8};

size_t DTypeSize(DType t);
absl::string_view DTypeName(DType t);  // "f32", "f64", "bf16", "f16", "i32", "i64", "u8"
bool IsFloating(DType t);
bool IsHalf(DType t);  // bf16 or f16: reduced through f32
bool IsValidDType(int raw);
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace braid

#endif  // BRAID_COMM_DTYPE_H_
