#include "tests/nccl/fake_nccl_reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "comm/check.h"
#include "comm/half.h"
#include "comm/reduce_kernels.h"
#include "comm/reduce_op.h"

namespace braid::nccl::testing {
namespace {

// Arithmetic in T as an NCCL kernel does it (see the header for the source it follows).
template <typename T>
struct InType {
  static T Mul(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else {
      return a * b;
    }
  }
  static T Add(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
  static T FromScalar(double s) { return static_cast<T>(s); }
};
template <>
struct InType<BF16> {  // __hmul / __hadd: the exact f32 result rounded once to bf16
  static BF16 Mul(BF16 a, BF16 b) { return ToBF16(ToFloat(a) * ToFloat(b)); }
  static BF16 Add(BF16 a, BF16 b) { return ToBF16(ToFloat(a) + ToFloat(b)); }
  static BF16 FromScalar(double s) { return ToBF16(static_cast<float>(s)); }
};
template <>
struct InType<F16> {
  static F16 Mul(F16 a, F16 b) { return ToF16(ToFloat(a) * ToFloat(b)); }
  static F16 Add(F16 a, F16 b) { return ToF16(ToFloat(a) + ToFloat(b)); }
  static F16 FromScalar(double s) { return ToF16(static_cast<float>(s)); }
};

// FuncSumPostDiv<int>::divide: truncation toward zero (C++ integer division does the same).
template <typename T>
T PostDiv(T x, int n) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(x / static_cast<T>(n));
  } else {
    return x;
  }
}

template <typename T>
void Reduce(const void* const* inputs, int n, void* const* outs, int n_outs, size_t count,
            DType dtype, FakeRedOp op, const double* scalars) {
  constexpr bool kFloating = !std::is_integral_v<T>;
  std::vector<T> s(n);
  for (int r = 0; r < n; ++r) {
    if (op == FakeRedOp::kPreMulSum) s[r] = InType<T>::FromScalar(scalars[r]);
    if (op == FakeRedOp::kAvg && kFloating) {
      s[r] = InType<T>::FromScalar(NcclAvgScalar(dtype, n));
    }
  }
  const bool premul = op == FakeRedOp::kPreMulSum || (op == FakeRedOp::kAvg && kFloating);
  const bool post_div = op == FakeRedOp::kAvg && !kFloating;
  for (size_t i = 0; i < count; ++i) {
    T acc{};
    for (int r = 0; r < n; ++r) {
      T v;
      std::memcpy(&v, static_cast<const char*>(inputs[r]) + i * sizeof(T), sizeof(T));
      if (premul) v = InType<T>::Mul(v, s[r]);  // Apply_PreOp: x * scalar
      acc = r == 0 ? v : InType<T>::Add(acc, v);
    }
    if (post_div) acc = PostDiv(acc, n);
    for (int k = 0; k < n_outs; ++k) {
      std::memcpy(static_cast<char*>(outs[k]) + i * sizeof(T), &acc, sizeof(T));
    }
  }
}

}  // namespace

double NcclAvgScalar(DType dtype, int nranks) {
  const double inv = 1.0 / nranks;  // enqueue.cc: 1.0/comm->nRanks, in double
  switch (dtype) {
    case DType::kF64:
      return inv;
    case DType::kF32:
      return static_cast<float>(inv);
    case DType::kBF16:
      return ToFloat(ToBF16(static_cast<float>(inv)));
    case DType::kF16:
      return ToFloat(ToF16(static_cast<float>(inv)));
    default:
      return inv;  // integers: no scalar (SumPostDiv)
  }
}

void FakeNcclReduce(const void* const* inputs, int n, void* const* outs, int n_outs, size_t count,
                    DType dtype, FakeRedOp op, const double* scalars) {
  BRAID_CHECK(n >= 1 && n_outs >= 1);
  if (op == FakeRedOp::kMax || op == FakeRedOp::kMin) {  // no arithmetic: the CPU kernel's
    ReduceIntoMany(inputs, n, outs, n_outs, count, dtype,
                   op == FakeRedOp::kMax ? ReduceOp::Max() : ReduceOp::Min(), n);
    return;
  }
  switch (dtype) {
    case DType::kF32:
      return Reduce<float>(inputs, n, outs, n_outs, count, dtype, op, scalars);
    case DType::kF64:
      return Reduce<double>(inputs, n, outs, n_outs, count, dtype, op, scalars);
    case DType::kBF16:
      return Reduce<BF16>(inputs, n, outs, n_outs, count, dtype, op, scalars);
    case DType::kF16:
      return Reduce<F16>(inputs, n, outs, n_outs, count, dtype, op, scalars);
    case DType::kI32:
      return Reduce<int32_t>(inputs, n, outs, n_outs, count, dtype, op, scalars);
    case DType::kI64:
      return Reduce<int64_t>(inputs, n, outs, n_outs, count, dtype, op, scalars);
    case DType::kU8:
      return Reduce<uint8_t>(inputs, n, outs, n_outs, count, dtype, op, scalars);
  }
}

}  // namespace braid::nccl::testing
