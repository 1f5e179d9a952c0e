// Element conversions shared by the CUDA bucket kernels and their CPU reference: one source, so
// the reference computes what the kernels compute, and the tests compare them bit for bit.
//
// Element types are numbered as braid::DType (comm/dtype.h): kF32 = 0, kBF16 = 2, kF16 = 3 (the
// dtypes a gradient bucket or its reduce dtype uses). Widening is exact; narrowing rounds to
// nearest even with comm/half.h's NaN and overflow rules (the CPU test checks all 2^16 halves
// and a sweep of floats against comm/half.h). Arithmetic: f32, each operation rounded on its
// own (__fmul_rn / __fdiv_rn / __fadd_rn on the device: never contracted into an FMA, true
// division), with the NaN results of the x86-64 host (HostMul / HostDiv / HostAdd), so a
// device kernel, its CPU reference and the host's BufferOps (comm/reduce_kernels.h) agree bit
// for bit, NaN payloads included.
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

BRAID_HD float Div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// NaN results as the x86-64 host computes them (SSE/AVX): a NaN operand comes back quiet; an
// invalid operation (inf - inf, 0 * inf, 0 / 0, inf / inf) gives the "real indefinite"
// 0xffc00000. The device would give 0x7fffffff for all of these. When both operands are NaN
// the host returns the one its compiler placed first (not fixed by the source); here: a's.
BRAID_HD bool IsNaN(float f) { return (FBits(f) & 0x7fffffffu) > 0x7f800000u; }
BRAID_HD float Quiet(float f) { return BitsF(FBits(f) | 0x00400000u); }
BRAID_HD float HostNaN(float a, float b, float r) {
  if (IsNaN(a)) return Quiet(a);
  if (IsNaN(b)) return Quiet(b);
  return IsNaN(r) ? BitsF(0xffc00000u) : r;
}
BRAID_HD float HostMul(float a, float b) { return HostNaN(a, b, Mul(a, b)); }
BRAID_HD float HostDiv(float a, float b) { return HostNaN(a, b, Div(a, b)); }
BRAID_HD float HostAdd(float a, float b) { return HostNaN(a, b, Add(a, b)); }

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

// dst[i] = narrow(widen(src[i]) * scale): the element rule of pack and unpack.
BRAID_HD void ConvertElement(const void* src, size_t si, int src_dtype, void* dst, size_t di,
                             int dst_dtype, float scale) {
  StoreAs(dst, di, dst_dtype, HostMul(LoadAs(src, si, src_dtype), scale));
}

// The scaling of braid::CastScale (comm/reduce_kernels.h, f32 arithmetic) for the kernels:
// v = widen(src); if (apply_mul) v = mul * v; if (div > 0) v = v / div; dst = narrow(v).
// `mul` is ScaleSpec::mul rounded to f32; `div` is converted to f32 here, as the host does. A plain
// cast: ScaleArgs{} (no operation at all).
struct ScaleArgs {
  int apply_mul = 0;
  float mul = 1.0f;
  int div = 0;
};

BRAID_HD void CastScaleElement(const void* src, size_t i, int src_dtype, void* dst, int dst_dtype,
                               const ScaleArgs& s) {
  float v = LoadAs(src, i, src_dtype);
  if (s.apply_mul) v = HostMul(s.mul, v);
  if (s.div > 0) v = HostDiv(v, static_cast<float>(s.div));
  StoreAs(dst, i, dst_dtype, v);
}

// dst[i] = narrow(widen(a[i]) + widen(b[i])): braid::ReduceInto's sum of {a, b} (f32
// accumulation for bf16/f16, one rounding). dst may alias a or b (each element is read before
// it is written).
BRAID_HD void AddElement(const void* a, const void* b, void* dst, size_t i, int dtype) {
  StoreAs(dst, i, dtype, HostAdd(LoadAs(a, i, dtype), LoadAs(b, i, dtype)));
}

}  // namespace braid::nccl::kernels

#endif  // BRAID_BACKENDS_NCCL_KERNELS_BUCKET_CONVERT_H_
