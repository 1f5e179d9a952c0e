#include "comm/reduce_kernels.h"

#include <algorithm>
#include <cstring>

#if defined(__AVX2__)
#include <immintrin.h>
#endif
#include <cstdint>
#include <type_traits>

#include "comm/check.h"
#include "comm/half.h"

namespace braid {
namespace {

// Per-storage-type accumulation rules. Integer sums wrap (done in the unsigned type: no UB).
template <typename T>
struct Traits {
  using Acc = T;
  static Acc Load(T x) { return x; }
  static T Store(Acc a) { return a; }
  static Acc Add(Acc a, Acc b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
template <>
struct Traits<BF16> {
  using Acc = float;
  static Acc Load(BF16 x) { return ToFloat(x); }
  static BF16 Store(Acc a) { return ToBF16(a); }
  static Acc Add(Acc a, Acc b) { return a + b; }
};
template <>
struct Traits<F16> {
  using Acc = float;
  static Acc Load(F16 x) { return ToFloat(x); }
  static F16 Store(Acc a) { return ToF16(a); }
  static Acc Add(Acc a, Acc b) { return a + b; }
};

constexpr size_t kBlock = 1024;

// Outputs at least this large bypass the cache (non-temporal stores): nobody reads them back
// soon, and a regular store would first read each line for ownership (a third more traffic).
constexpr size_t kStreamingBytes = size_t{16} << 20;

// Copies `bytes` from `src` (cache-resident) to `dst` with non-temporal stores. The caller
// issues StreamFence() before publishing `dst` to another thread.
void StreamCopy(void* dst, const void* src, size_t bytes) {
#if defined(__AVX2__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  const size_t head = std::min(bytes, (32 - reinterpret_cast<uintptr_t>(d) % 32) % 32);
  std::memcpy(d, s, head);
  size_t i = head;
  for (; i + 32 <= bytes; i += 32) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
  }
  std::memcpy(d + i, s + i, bytes - i);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void StreamFence() {
#if defined(__AVX2__)
  _mm_sfence();
#endif
}

// Writes acc[0..m) as T to out_k[base..base+m) for every output.
template <typename T, typename A>
void StoreBlock(const A* acc, size_t m, void* const* outs, int n_outs, size_t base, bool stream) {
  using Tr = Traits<T>;
  if (!stream) {
    T* first = static_cast<T*>(outs[0]) + base;
    for (size_t i = 0; i < m; ++i) first[i] = Tr::Store(acc[i]);
    for (int k = 1; k < n_outs; ++k)
      std::memcpy(static_cast<T*>(outs[k]) + base, first, m * sizeof(T));
    return;
  }
  T tmp[kBlock];
  for (size_t i = 0; i < m; ++i) tmp[i] = Tr::Store(acc[i]);
  for (int k = 0; k < n_outs; ++k) StreamCopy(static_cast<T*>(outs[k]) + base, tmp, m * sizeof(T));
}

template <typename T>
void ReduceTyped(const void* const* inputs, int n, void* const* outs, int n_outs, size_t count,
                 const ReduceOp& op, int group_size, const double* scalars) {
  using Tr = Traits<T>;
  using A = typename Tr::Acc;
  const bool stream = count * sizeof(T) >= kStreamingBytes;
  A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const T* p0 = static_cast<const T*>(inputs[0]) + base;
    if constexpr (std::is_floating_point_v<A>) {
      if (op.kind == ReduceKind::kPreMulSum) {
        const A s0 = static_cast<A>(scalars ? scalars[0] : op.scalar);
        for (size_t i = 0; i < m; ++i) acc[i] = s0 * Tr::Load(p0[i]);
        for (int k = 1; k < n; ++k) {
          const T* p = static_cast<const T*>(inputs[k]) + base;
          const A s = static_cast<A>(scalars ? scalars[k] : op.scalar);
          for (size_t i = 0; i < m; ++i) acc[i] = acc[i] + s * Tr::Load(p[i]);
        }
        StoreBlock<T>(acc, m, outs, n_outs, base, stream);
        continue;
      }
    }
    for (size_t i = 0; i < m; ++i) acc[i] = Tr::Load(p0[i]);
    for (int k = 1; k < n; ++k) {
      const T* p = static_cast<const T*>(inputs[k]) + base;
      switch (op.kind) {
        case ReduceKind::kMax:
          for (size_t i = 0; i < m; ++i) {
            const A v = Tr::Load(p[i]);
            acc[i] = v > acc[i] ? v : acc[i];
          }
          break;
        case ReduceKind::kMin:
          for (size_t i = 0; i < m; ++i) {
            const A v = Tr::Load(p[i]);
            acc[i] = v < acc[i] ? v : acc[i];
          }
          break;
        default:  // sum, avg
          for (size_t i = 0; i < m; ++i) acc[i] = Tr::Add(acc[i], Tr::Load(p[i]));
          break;
      }
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (op.kind == ReduceKind::kAvg) {
        const A d = static_cast<A>(group_size);
        for (size_t i = 0; i < m; ++i) acc[i] = acc[i] / d;
      }
    }
    StoreBlock<T>(acc, m, outs, n_outs, base, stream);
  }
  if (stream) StreamFence();  // order the streaming stores before whatever publishes them
}

template <typename Src, typename Dst>
void CastScaleTyped(const void* src_raw, void* dst_raw, size_t n, const ScaleSpec& sc) {
  using A =
      std::conditional_t<std::is_same_v<Src, double> || std::is_same_v<Dst, double>, double, float>;
  const Src* src = static_cast<const Src*>(src_raw);
  Dst* dst = static_cast<Dst*>(dst_raw);
  const A mul = static_cast<A>(sc.mul);
  const A div = static_cast<A>(sc.div);
  for (size_t i = 0; i < n; ++i) {
    A v = static_cast<A>(Traits<Src>::Load(src[i]));
    if (sc.apply_mul) v = mul * v;
    if (sc.div > 0) v = v / div;
    if constexpr (std::is_same_v<Dst, double>) {
      dst[i] = v;
    } else {
      dst[i] = Traits<Dst>::Store(static_cast<float>(v));
    }
  }
}

template <typename Src>
void CastScaleFrom(const void* src, void* dst, DType dst_type, size_t n, const ScaleSpec& sc) {
  switch (dst_type) {
    case DType::kF32:
      return CastScaleTyped<Src, float>(src, dst, n, sc);
    case DType::kF64:
      return CastScaleTyped<Src, double>(src, dst, n, sc);
    case DType::kBF16:
      return CastScaleTyped<Src, BF16>(src, dst, n, sc);
    case DType::kF16:
      return CastScaleTyped<Src, F16>(src, dst, n, sc);
    default:
      BRAID_CHECK(false && "CastScale: destination dtype must be floating");
  }
}

}  // namespace

void ReduceIntoMany(const void* const* inputs, int n, void* const* outs, int n_outs, size_t count,
                    DType dtype, const ReduceOp& op, int group_size, const double* scalars) {
  BRAID_CHECK(n >= 1 && n_outs >= 1);
  switch (dtype) {
    case DType::kF32:
      return ReduceTyped<float>(inputs, n, outs, n_outs, count, op, group_size, scalars);
    case DType::kF64:
      return ReduceTyped<double>(inputs, n, outs, n_outs, count, op, group_size, scalars);
    case DType::kBF16:
      return ReduceTyped<BF16>(inputs, n, outs, n_outs, count, op, group_size, scalars);
    case DType::kF16:
      return ReduceTyped<F16>(inputs, n, outs, n_outs, count, op, group_size, scalars);
    case DType::kI32:
      return ReduceTyped<int32_t>(inputs, n, outs, n_outs, count, op, group_size, scalars);
    case DType::kI64:
      return ReduceTyped<int64_t>(inputs, n, outs, n_outs, count, op, group_size, scalars);
    case DType::kU8:
      return ReduceTyped<uint8_t>(inputs, n, outs, n_outs, count, op, group_size, scalars);
  }
}

void ReduceInto(const void* const* inputs, int n, void* out, size_t count, DType dtype,
                const ReduceOp& op, int group_size, const double* scalars) {
  void* outs[1] = {out};
  ReduceIntoMany(inputs, n, outs, 1, count, dtype, op, group_size, scalars);
}

void CastScale(const void* src, DType src_type, void* dst, DType dst_type, size_t n,
               const ScaleSpec& scale) {
  switch (src_type) {
    case DType::kF32:
      return CastScaleFrom<float>(src, dst, dst_type, n, scale);
    case DType::kF64:
      return CastScaleFrom<double>(src, dst, dst_type, n, scale);
    case DType::kBF16:
      return CastScaleFrom<BF16>(src, dst, dst_type, n, scale);
    case DType::kF16:
      return CastScaleFrom<F16>(src, dst, dst_type, n, scale);
    default:
      BRAID_CHECK(false && "CastScale: source dtype must be floating");
  }
}

}  // namespace braid
