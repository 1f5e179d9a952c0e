// One element of a typed array, read or written as a double: for references, checks and
// benchmarks (not for hot paths: one switch per element). Any DType; the pointer needs no
// alignment. Half-precision stores round the value to f32 first, then to bf16/f16 (nearest
// even), as ToBF16 / ToF16 do; integer stores truncate. Going through double quiets a
// signaling NaN: code that must keep NaN payloads bit for bit works in float.
#ifndef BRAID_COMM_ELEMENT_H_
#define BRAID_COMM_ELEMENT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "comm/dtype.h"
#include "comm/half.h"

namespace braid {

namespace element_internal {
template <typename T>
T Get(const void* p, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(p) + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void Set(void* p, size_t i, T v) {
  std::memcpy(static_cast<char*>(p) + i * sizeof(T), &v, sizeof(T));
}
}  // namespace element_internal

inline double LoadElement(const void* p, DType t, size_t i) {
  using element_internal::Get;
  switch (t) {
    case DType::kF32:
      return Get<float>(p, i);
    case DType::kF64:
      return Get<double>(p, i);
    case DType::kBF16:
      return ToFloat(Get<BF16>(p, i));
    case DType::kF16:
      return ToFloat(Get<F16>(p, i));
    case DType::kI32:
      return Get<int32_t>(p, i);
    case DType::kI64:
      return static_cast<double>(Get<int64_t>(p, i));
    case DType::kU8:
      return Get<uint8_t>(p, i);
  }
  return 0;
}

inline void StoreElement(void* p, DType t, size_t i, double v) {
  using element_internal::Set;
  switch (t) {
    case DType::kF32:
      Set(p, i, static_cast<float>(v));
      break;
    case DType::kF64:
      Set(p, i, v);
      break;
    case DType::kBF16:
      Set(p, i, ToBF16(static_cast<float>(v)));
      break;
    case DType::kF16:
      Set(p, i, ToF16(static_cast<float>(v)));
      break;
    case DType::kI32:
      Set(p, i, static_cast<int32_t>(v));
      break;
    case DType::kI64:
      Set(p, i, static_cast<int64_t>(v));
      break;
    case DType::kU8:
      Set(p, i, static_cast<uint8_t>(v));
      break;
  }
}

}  // namespace braid

#endif  // BRAID_COMM_ELEMENT_H_
