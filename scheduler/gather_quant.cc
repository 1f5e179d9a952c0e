#include "scheduler/gather_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace braid::sched {
namespace {

constexpr float kFp8Max = 448.0f;  // E4M3: 2^8 x 1.75

size_t Blocks(const GatherQuant& q, size_t n) {
  const size_t b = static_cast<size_t>(q.block);
  return (n + b - 1) / b;
}

float QuantMax(GatherDType t) { return t == GatherDType::kInt8 ? 127.0f : kFp8Max; }

uint8_t Encode(GatherDType t, float v) {
  if (t == GatherDType::kInt8) {
    const float c = std::min(127.0f, std::max(-127.0f, std::nearbyint(v)));
    return static_cast<uint8_t>(static_cast<int8_t>(c));
  }
  return Fp8E4M3FromFloat(v);
}

float Decode(GatherDType t, uint8_t c) {
  if (t == GatherDType::kInt8) return static_cast<float>(static_cast<int8_t>(c));
  return Fp8E4M3ToFloat(c);
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
  }
  return "?";
}

size_t QuantRecordBytes(const GatherQuant& q, size_t n) { return Blocks(q, n) * sizeof(float) + n; }

void QuantizeBlocks(const GatherQuant& q, const float* x, size_t n, uint8_t* record) {
  const size_t block = static_cast<size_t>(q.block);
  uint8_t* codes = record + Blocks(q, n) * sizeof(float);
  const float qmax = QuantMax(q.dtype);
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
    const float scale = finite ? amax / qmax : std::numeric_limits<float>::quiet_NaN();
    for (size_t i = lo; i < hi; ++i) codes[i] = scale > 0.0f ? Encode(q.dtype, x[i] / scale) : 0;
    std::memcpy(record + k * sizeof(float), &scale, sizeof(float));
  }
}

void DequantizeBlocks(const GatherQuant& q, const uint8_t* record, size_t n, float* out) {
  const size_t block = static_cast<size_t>(q.block);
  const uint8_t* codes = record + Blocks(q, n) * sizeof(float);
  for (size_t k = 0, lo = 0; lo < n; ++k, lo += block) {
    const size_t hi = std::min(n, lo + block);
    float scale;
    std::memcpy(&scale, record + k * sizeof(float), sizeof(float));
    for (size_t i = lo; i < hi; ++i) out[i] = Decode(q.dtype, codes[i]) * scale;
  }
}

uint8_t Fp8E4M3FromFloat(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  if (a >= kFp8Max) return sign | 0x7e;  // saturate (no infinity in E4M3)
  if (a < 0.015625f) {                   // below 2^-6: subnormal, steps of 2^-9
    // Exact scaling by a power of two; a code of 8 is the smallest normal (2^-6), as wanted.
    return sign | static_cast<uint8_t>(std::nearbyint(std::ldexp(a, 9)));
  }
  int e2;
  std::frexp(a, &e2);    // a = f 2^e2, f in [0.5, 1): a in [2^(e2-1), 2^e2)
  const int e = e2 - 1;  // unbiased exponent, in [-6, 8]
  const int mant = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e)));  // in [8, 16]
  const int code = ((e + 7) << 3) + (mant - 8);  // a mantissa of 16 carries into the exponent
  return sign | static_cast<uint8_t>(std::min(code, 0x7e));
}

float Fp8E4M3ToFloat(uint8_t c) {
  const int e = (c >> 3) & 0xf, m = c & 0x7;
  float v;
  if (e == 0xf && m == 0x7) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -9);
  } else {
    v = std::ldexp(static_cast<float>(8 + m), e - 10);
  }
  return (c & 0x80) ? -v : v;
}

}  // namespace braid::sched
