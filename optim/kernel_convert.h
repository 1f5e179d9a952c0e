// Private to //optim:kernels: loads of gradient storage types widened to f32 and stores of f32
// narrowed to parameter storage types, one element (scalar) or eight (AVX2 + F16C) at a time.
// The eight-wide versions give exactly the bits of comm/half.h's conversions.
#ifndef BRAID_OPTIM_KERNEL_CONVERT_H_
#define BRAID_OPTIM_KERNEL_CONVERT_H_

#include <cstdint>

#include "comm/check.h"
#include "comm/dtype.h"
#include "comm/half.h"

#if defined(__AVX2__) && defined(__F16C__)
#define BRAID_OPTIM_AVX2 1
#include <immintrin.h>
#endif

namespace braid::optim::internal {

// Stands for "no param_out" in the kernels' type dispatch.
struct NoOut {};

inline float Widen(float x) { return x; }
inline float Widen(BF16 x) { return ToFloat(x); }
inline float Widen(F16 x) { return ToFloat(x); }

inline void Narrow(float* o, float x) { *o = x; }
inline void Narrow(BF16* o, float x) { *o = ToBF16(x); }
inline void Narrow(F16* o, float x) { *o = ToF16(x); }

// Calls f(T{}) with T the storage type of a gradient dtype (f32, bf16, f16).
template <typename F>
void WithGradType(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(BF16{});
    case DType::kF16:
      return f(F16{});
    default:
      BRAID_CHECK(false && "optimizer kernels: grad dtype must be f32, bf16 or f16");
  }
}

// Calls f(T{}) with T the storage type of param_out's dtype, or NoOut when there is none.
template <typename F>
void WithOutType(const void* out, DType t, F&& f) {
  if (out == nullptr) return f(NoOut{});
  switch (t) {
    case DType::kF32:
      return f(float{});
    case DType::kBF16:
      return f(BF16{});
    case DType::kF16:
      return f(F16{});
    default:
      BRAID_CHECK(false && "optimizer kernels: param_out dtype must be f32, bf16 or f16");
  }
}

#if defined(BRAID_OPTIM_AVX2)

inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }

inline __m256 Load8(const BF16* p) {
  // bf16 is the top half of an f32: zero-extend and shift, exact.
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline __m256 Load8(const F16* p) {
  // vcvtph2ps is exact for every f16; a signalling NaN comes back quiet, which the first
  // arithmetic operation would do to ToFloat's result anyway.
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline void Store8(float* o, __m256 x) { _mm256_storeu_ps(o, x); }

// Eight u32 lanes holding values < 2^16 -> eight u16.
inline __m128i Pack16(__m256i x) {
  return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

inline void Store8(BF16* o, __m256 x) {
  // ToBF16, lane-wise: round to nearest even by integer add. NaNs (rare) take a separate,
  // predictable branch so the common case stays a few integer instructions.
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  if (__builtin_expect(_mm256_movemask_ps(is_nan) != 0, 0)) {
    // NaN: the top half with the quiet bit set, as ToBF16 does.
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, nan, _mm256_castps_si256(is_nan));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), Pack16(r));
}

inline void Store8(F16* o, __m256 x) {
  // vcvtps2ph rounds to nearest even like ToF16 (subnormals and overflow to inf included); only
  // NaNs differ: it keeps payload bits, ToF16 writes the canonical sign | 0x7e00.
  __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  if (__builtin_expect(_mm256_movemask_ps(is_nan) != 0, 0)) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i canon =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)),
                        _mm256_set1_epi32(0x7e00));
    h = _mm_blendv_epi8(h, Pack16(canon),
                        Pack16(_mm256_srli_epi32(_mm256_castps_si256(is_nan), 16)));
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), h);
}

#endif  // BRAID_OPTIM_AVX2

}  // namespace braid::optim::internal

#endif  // BRAID_OPTIM_KERNEL_CONVERT_H_
