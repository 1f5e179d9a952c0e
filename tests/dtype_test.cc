// dtype names, sizes, parsing, and the bf16/f16 conversions against the compiler's own
// _Float16 (IEEE binary16) and exhaustive round trips.
#include "comm/dtype.h"

#include <cmath>
#include <cstring>
#include <random>

#include "comm/half.h"
#include "comm/reduce_op.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

TEST(DType, SizesNamesAndParse) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kI32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  for (DType t : kAllDTypes) {
    auto p = ParseDType(DTypeName(t));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, t);
  }
  auto bad = ParseDType("f8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'f8'"), absl::string_view::npos);
  EXPECT_FALSE(IsValidDType(7));
  EXPECT_FALSE(IsValidDType(-1));
}

TEST(ReduceOp, ValidationNamesOpAndDType) {
  EXPECT_TRUE(ValidateReduceOp(ReduceOp::Sum(), DType::kU8).ok());
  EXPECT_TRUE(ValidateReduceOp(ReduceOp::Max(), DType::kI64).ok());
  EXPECT_TRUE(ValidateReduceOp(ReduceOp::Avg(), DType::kBF16).ok());
  absl::Status s = ValidateReduceOp(ReduceOp::Avg(), DType::kI32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("avg"), absl::string_view::npos);
  EXPECT_NE(s.message().find("i32"), absl::string_view::npos);
  s = ValidateReduceOp(ReduceOp::PreMulSum(NAN), DType::kF32);
  EXPECT_NE(s.message().find("finite"), absl::string_view::npos);
  s = ValidateReduceOp(ReduceOp{static_cast<ReduceKind>(42), 1.0}, DType::kF32);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  for (ReduceKind k : kAllReduceKinds) {
    auto p = ParseReduceKind(ReduceKindName(k));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, k);
  }
}

uint16_t Bits(_Float16 h) {
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

TEST(Half, F16MatchesCompilerConversionOnEveryPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    _Float16 h;
    const uint16_t bits = static_cast<uint16_t>(b);
    std::memcpy(&h, &bits, 2);
    const float want = static_cast<float>(h);
    const float got = ToFloat(F16{bits});
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "pattern " << b;
    ASSERT_EQ(ToF16(got).bits, bits) << "round trip of pattern " << b;
  }
}

TEST(Half, F16RoundingMatchesCompilerOnRandomFloats) {
  std::mt19937 rng(5);
  for (int i = 0; i < 2'000'000; ++i) {
    uint32_t u = rng();
    // Concentrate on the f16 range (exponents around 2^-25 .. 2^17), plus raw random bits.
    if (i % 2) u = (u & 0x807fffffu) | ((100u + (u >> 23) % 45u) << 23);
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    const _Float16 want = static_cast<_Float16>(f);
    ASSERT_EQ(ToF16(f).bits, Bits(want)) << "float bits 0x" << std::hex << u;
  }
}

TEST(Half, BF16RoundsToNearestEven) {
  // Exactly representable values survive.
  for (float f : {0.0f, 1.0f, -2.5f, 3.140625f, 65536.0f}) EXPECT_EQ(ToFloat(ToBF16(f)), f);
  // Ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 -> 1.
  EXPECT_EQ(ToFloat(ToBF16(1.0f + 0.00390625f)), 1.0f);
  // 1 + 3*2^-8 is halfway between 1+2^-7 and 1+2^-6 -> 1+2^-6 (even mantissa).
  EXPECT_EQ(ToFloat(ToBF16(1.0f + 3 * 0.00390625f)), 1.0f + 0.015625f);
  EXPECT_TRUE(std::isnan(ToFloat(ToBF16(NAN))));
  EXPECT_TRUE(std::isinf(ToFloat(ToBF16(INFINITY))));
  // Every bf16 pattern round-trips.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = ToFloat(BF16{static_cast<uint16_t>(b)});
    if (std::isnan(f)) continue;
    ASSERT_EQ(ToBF16(f).bits, b);
  }
  // Against a reference: the nearest of the two neighbours, ties to even.
  std::mt19937 rng(9);
  for (int i = 0; i < 1'000'000; ++i) {
    const uint32_t u = rng() & 0x7f7fffffu;  // finite, positive
    float f;
    std::memcpy(&f, &u, 4);
    const uint32_t lo = u & 0xffff0000u, rem = u & 0xffffu;
    uint32_t want = lo;
    if (rem > 0x8000u || (rem == 0x8000u && (lo & 0x10000u))) want = lo + 0x10000u;
    ASSERT_EQ(static_cast<uint32_t>(ToBF16(f).bits) << 16, want) << std::hex << u;
  }
}

}  // namespace
}  // namespace braid
