#include "scheduler/gather_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "comm/reduce_kernels.h"

namespace braid::sched {
namespace {

constexpr float kFp8Max = 448.0f;  // E4M3: 2^8 x 1.75

size_t Blocks(const GatherQuant& q, size_t n) {
  const size_t b = static_cast<size_t>(q.block);
  return (n + b - 1) / b;
}

template <GatherDType T>
uint8_t Encode(float v) {
  if constexpr (T == GatherDType::kInt8) {
    const float c = std::min(127.0f, std::max(-127.0f, std::nearbyint(v)));
    return static_cast<uint8_t>(static_cast<int8_t>(c));
  } else {
    return Fp8E4M3FromFloat(v);
  }
}

template <GatherDType T>
float Decode(uint8_t c) {
  if constexpr (T == GatherDType::kInt8) {
    return static_cast<float>(static_cast<int8_t>(c));
  } else {
    return Fp8E4M3ToFloat(c);
  }
}

// One dtype's loops (kept apart so that the int8 ones vectorize).
template <GatherDType T>
void QuantizeT(size_t block, const float* x, size_t n, size_t blocks, uint8_t* record) {
  uint8_t* codes = record + blocks * sizeof(float);
  constexpr float kQmax = T == GatherDType::kInt8 ? 127.0f : kFp8Max;
  for (size_t k = 0, lo = 0; lo < n; ++k, lo += block) {
    const size_t hi = std::min(n, lo + block);
    float amax = 0.0f;
    bool finite = true;
    for (size_t i = lo; i < hi; ++i) {
      amax = std::max(amax, std::fabs(x[i]));
      finite = finite && std::isfinite(x[i]);
    }
    // A non-finite value poisons its whole block (scale NaN: every value decodes to NaN) rather
    // than turning into a finite code.
    const float scale = finite ? amax / kQmax : std::numeric_limits<float>::quiet_NaN();
    if (scale > 0.0f) {
      for (size_t i = lo; i < hi; ++i) codes[i] = Encode<T>(x[i] / scale);
    } else {
      std::memset(codes + lo, 0, hi - lo);
    }
    std::memcpy(record + k * sizeof(float), &scale, sizeof(float));
  }
}

template <GatherDType T>
void DequantizeT(size_t block, const uint8_t* record, size_t n, size_t blocks, float* out) {
  const uint8_t* codes = record + blocks * sizeof(float);
  for (size_t k = 0, lo = 0; lo < n; ++k, lo += block) {
    const size_t hi = std::min(n, lo + block);
    float scale;
    std::memcpy(&scale, record + k * sizeof(float), sizeof(float));
    for (size_t i = lo; i < hi; ++i) out[i] = Decode<T>(codes[i]) * scale;
  }
}

}  // namespace

absl::string_view GatherDTypeName(GatherDType t) {
  switch (t) {
    case GatherDType::kExact:
      return "exact";
    case GatherDType::kInt8:
      return "int8";
    case GatherDType::kFp8E4M3:
      return "fp8_e4m3";
    case GatherDType::kBF16:
      return "bf16";
    case GatherDType::kF16:
      return "f16";
  }
  return "?";
}

bool IsCastGather(GatherDType t) { return t == GatherDType::kBF16 || t == GatherDType::kF16; }

size_t QuantRecordBytes(const GatherQuant& q, size_t n) {
  if (IsCastGather(q.dtype)) return n * sizeof(uint16_t);
  return Blocks(q, n) * sizeof(float) + n;
}

void QuantizeBlocks(const GatherQuant& q, const float* x, size_t n, uint8_t* record) {
  const size_t block = static_cast<size_t>(q.block);
  if (IsCastGather(q.dtype)) {  // rounded to nearest even, as torch casts (comm/half.h)
    CastScale(x, DType::kF32, record, q.dtype == GatherDType::kBF16 ? DType::kBF16 : DType::kF16, n,
              ScaleSpec{});
  } else if (q.dtype == GatherDType::kInt8) {
    QuantizeT<GatherDType::kInt8>(block, x, n, Blocks(q, n), record);
  } else {
    QuantizeT<GatherDType::kFp8E4M3>(block, x, n, Blocks(q, n), record);
  }
}

void DequantizeBlocks(const GatherQuant& q, const uint8_t* record, size_t n, float* out) {
  const size_t block = static_cast<size_t>(q.block);
  if (IsCastGather(q.dtype)) {
    CastScale(record, q.dtype == GatherDType::kBF16 ? DType::kBF16 : DType::kF16, out, DType::kF32,
              n, ScaleSpec{});
  } else if (q.dtype == GatherDType::kInt8) {
    DequantizeT<GatherDType::kInt8>(block, record, n, Blocks(q, n), out);
  } else {
    DequantizeT<GatherDType::kFp8E4M3>(block, record, n, Blocks(q, n), out);
  }
}

uint8_t Fp8E4M3FromFloat(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80);
  const uint32_t bits = u & 0x7fffffffu;        // |x|
  if (bits > 0x7f800000u) return 0x7f;          // NaN
  if (bits >= 0x43e00000u) return sign | 0x7e;  // >= 448 (and inf): saturate
  if (bits < 0x3c800000u) {                     // below 2^-6: subnormal, steps of 2^-9
    // |x| x 2^9 is exact; rounding half to even to an integer in [0, 8] (8: the smallest
    // normal, 2^-6, which is code 8 too).
    float a;
    std::memcpy(&a, &bits, sizeof a);
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: round the 23-bit mantissa to 3 bits, half to even, carrying into the exponent;
  // then rebias the exponent from 127 to 7. 448 < |x| < 464 rounds to 448 (code 0x7e);
  // from 464 on, to the NaN code: saturate.
  const uint32_t rounded = bits + 0x7ffffu + ((bits >> 20) & 1u);
  const uint32_t code = (rounded >> 20) - ((127u - 7u) << 3);
  return sign | static_cast<uint8_t>(code > 0x7eu ? 0x7eu : code);
}

float Fp8E4M3ToFloat(uint8_t c) {
  const uint32_t e = (c >> 3) & 0xfu, m = c & 0x7u;
  float v;
  if (e == 0xf && m == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = static_cast<float>(m) * (1.0f / 512.0f);  // m x 2^-9, exact
  } else {
    const uint32_t bits = ((e + 120u) << 23) | (m << 20);
    std::memcpy(&v, &bits, sizeof v);
  }
  return (c & 0x80) ? -v : v;
}

}  // namespace braid::sched
