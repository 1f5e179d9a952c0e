#include "comm/dtype.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace braid {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF64:
      return "f64";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
  }
  return "invalid-dtype";
}

bool IsFloating(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}

bool IsHalf(DType t) { return t == DType::kBF16 || t == DType::kF16; }

bool IsValidDType(int raw) { return raw >= 0 && raw <= static_cast<int>(DType::kU8); }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType t : kAllDTypes) {
    if (DTypeName(t) == name) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown dtype '", name, "' (expected one of f32, f64, bf16, f16, i32, i64, u8)"));
}

}  // namespace braid
