// Element conversions shared by the CUDA bucket kernels and their CPU reference: one source, so
// the reference computes what the kernels compute, and the tests compare them bit for bit.
//
// Element types are numbered as braid::DType (comm/dtype.h): kF32 = 0, kBF16 = 2, kF16 = 3 (the
// dtypes a gradient bucket or its reduce dtype uses). Widening is exact; narrowing rounds to
// nearest even with comm/half.h's NaN and overflow rules (the CPU test checks all 2^16 halves
// and a sweep of floats against comm/half.h). Arithmetic: one f32 multiply per element
// (__fmul_rn on the device: never contracted into an FMA).
//
// This header includes no CUDA or Abseil header, so both nvcc and the host compiler read it.
#ifndef BRAID_BACKENDS_NCCL_KERNELS_BUCKET_CONVERT_H_
#define BRAID_BACKENDS_NCCL_KERNELS_BUCKET_CONVERT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define BRAID_HD __host__ __device__ __forceinline__
#else
#define BRAID_HD inline
#endif

namespace braid::nccl::kernels {

inline constexpr int kF32 = 0;   // DType::kF32
inline constexpr int kBF16 = 2;  // DType::kBF16
inline constexpr int kF16 = 3;   // DType::kF16

inline bool ValidDType(int t) { return t == kF32 || t == kBF16 || t == kF16; }
inline size_t ElemSize(int t) { return t == kF32 ? 4 : 2; }

BRAID_HD uint32_t FBits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

BRAID_HD float BitsF(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

BRAID_HD float Add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

BRAID_HD float Mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

BRAID_HD float Bf16ToFloat(uint16_t h) { return BitsF(static_cast<uint32_t>(h) << 16); }

BRAID_HD uint16_t FloatToBf16(float f) {
  uint32_t u = FBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

BRAID_HD float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return BitsF(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return BitsF(sign | ((exp + 112u) << 23) | (man << 13));
  const float mag = Mul(static_cast<float>(man), 5.9604644775390625e-8f);  // exact
  return sign ? -mag : mag;
}

BRAID_HD uint16_t FloatToF16(float f) {
  const uint32_t u = FBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs < 0x38800000u) {
    const float scaled = Add(BitsF(abs), 0.5f);
    return static_cast<uint16_t>(sign | (FBits(scaled) - 0x3f000000u));
  }
  const uint32_t v = abs + 0xc8000fffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | (v >> 13));
}

BRAID_HD float LoadAs(const void* p, size_t i, int dtype) {
  if (dtype == kF32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return dtype == kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
}

BRAID_HD void StoreAs(void* p, size_t i, int dtype, float v) {
  if (dtype == kF32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = dtype == kBF16 ? FloatToBf16(v) : FloatToF16(v);
  }
}

// dst[i] = narrow(widen(src[i]) * scale): the one element rule of every kernel here.
BRAID_HD void ConvertElement(const void* src, size_t si, int src_dtype, void* dst, size_t di,
                             int dst_dtype, float scale) {
  StoreAs(dst, di, dst_dtype, Mul(LoadAs(src, si, src_dtype), scale));
}

}  // namespace braid::nccl::kernels

#endif  // BRAID_BACKENDS_NCCL_KERNELS_BUCKET_CONVERT_H_
