// bf16 and IEEE f16 storage types with exact float conversions (round to nearest even).
//
// Braid reduces bf16/f16 with f32 accumulation: widen with ToFloat, accumulate, narrow once
// with ToBF16 / ToF16. Both conversions are branch-light so loops over them vectorize.
#ifndef BRAID_COMM_HALF_H_
#define BRAID_COMM_HALF_H_

#include <cstdint>
#include <cstring>

namespace braid {

struct BF16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float ToFloat(BF16 h) { return BitsFloat(static_cast<uint32_t>(h.bits) << 16); }

inline BF16 ToBF16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it quiet and a NaN after truncation
    return BF16{static_cast<uint16_t>((u >> 16) | 0x40u)};
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return BF16{static_cast<uint16_t>(u >> 16)};
}

inline float ToFloat(F16 h) {
  const uint32_t sign = static_cast<uint32_t>(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return BitsFloat(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp != 0) return BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24, exact in float.
  const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

inline F16 ToF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return F16{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return F16{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero: value / 2^-24 rounded to nearest even. Adding 0.5f forces
    // the float unit to do the rounding: the result lands in [0.5, 1) with 2^-24 resolution.
    const float scaled = BitsFloat(abs) + 0.5f;
    return F16{static_cast<uint16_t>(sign | (FloatBits(scaled) - 0x3f000000u))};
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits, ties to even.
  uint32_t v = abs + 0xc8000fffu + ((abs >> 13) & 1u);  // -(112 << 23) + 0xfff
  return F16{static_cast<uint16_t>(sign | (v >> 13))};
}

}  // namespace braid

#endif  // BRAID_COMM_HALF_H_
