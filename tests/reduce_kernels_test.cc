// The CPU reduce/cast kernels against plain scalar loops: both store paths (cached, and
// non-temporal for outputs >= 16 MiB), misaligned outputs, outputs aliasing inputs, several
// outputs, and CastScale's staging conversions.
#include "comm/reduce_kernels.h"

#include <cstring>
#include <random>
#include <vector>

#include "comm/half.h"
#include "gtest/gtest.h"

namespace braid {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Sizes on both sides of the 16 MiB streaming threshold (f32), odd so tails are exercised.
constexpr size_t kSmall = 1000 + 3;
constexpr size_t kLarge = (size_t{16} << 20) / 4 + 1027;

class ReduceKernels : public ::testing::TestWithParam<std::tuple<size_t, int /*misalign*/>> {};

TEST_P(ReduceKernels, SumOfThreeIntoTwoMisalignedOutputsMatchesScalarLoop) {
  const auto [n, misalign] = GetParam();
  const auto a = Random(n, 1), b = Random(n, 2), c = Random(n, 3);
  std::vector<float> o1(n + 8, -1.0f), o2(n + 8, -1.0f);
  const void* in[3] = {a.data(), b.data(), c.data()};
  void* out[2] = {o1.data() + misalign, o2.data() + misalign};
  ReduceIntoMany(in, 3, out, 2, n, DType::kF32, ReduceOp::Sum(), 3);
  for (size_t i = 0; i < n; ++i) {
    const float want = (a[i] + b[i]) + c[i];
    ASSERT_EQ(o1[misalign + i], want) << i;
    ASSERT_EQ(o2[misalign + i], want) << i;
  }
  // Nothing outside the outputs was touched.
  for (int k = 0; k < misalign; ++k) ASSERT_EQ(o1[k], -1.0f);
  ASSERT_EQ(o1[misalign + n], -1.0f);
  ASSERT_EQ(o2[misalign + n], -1.0f);
}

INSTANTIATE_TEST_SUITE_P(Sizes, ReduceKernels,
                         ::testing::Combine(::testing::Values(kSmall, kLarge),
                                            ::testing::Values(0, 1, 3)));

TEST(ReduceKernelsAlias, InPlaceAvgOverInputsAndOutputsThatAlias) {
  for (size_t n : {kSmall, kLarge}) {
    auto a = Random(n, 4);
    const auto b = Random(n, 5);
    const auto a0 = a;
    const void* in[2] = {a.data(), b.data()};
    void* out[1] = {a.data()};  // output is input 0
    ReduceIntoMany(in, 2, out, 1, n, DType::kF32, ReduceOp::Avg(), 2);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(a[i], (a0[i] + b[i]) / 2.0f) << i;
  }
}

TEST(ReduceKernelsHalf, BF16PremulWithPerInputScalarsAccumulatesInF32) {
  const size_t n = (size_t{16} << 20) / 2 + 5;  // streaming path for bf16
  const auto fa = Random(n, 6), fb = Random(n, 7);
  std::vector<BF16> a(n), b(n), out(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = ToBF16(fa[i]);
    b[i] = ToBF16(fb[i]);
  }
  const void* in[2] = {a.data(), b.data()};
  const double scalars[2] = {0.25, 1.0 / 3.0};
  ReduceInto(in, 2, out.data(), n, DType::kBF16, ReduceOp::PreMulSum(9.0), 2, scalars);
  for (size_t i = 0; i < n; ++i) {
    const float want = 0.25f * ToFloat(a[i]) + static_cast<float>(1.0 / 3.0) * ToFloat(b[i]);
    ASSERT_EQ(out[i].bits, ToBF16(want).bits) << i;
  }
}

TEST(ReduceKernelsInt, U8SumWrapsAndMaxMin) {
  std::vector<uint8_t> a = {200, 1, 255}, b = {200, 2, 0}, out(3);
  const void* in[2] = {a.data(), b.data()};
  ReduceInto(in, 2, out.data(), 3, DType::kU8, ReduceOp::Sum(), 2);
  EXPECT_EQ(out, (std::vector<uint8_t>{144, 3, 255}));
  ReduceInto(in, 2, out.data(), 3, DType::kU8, ReduceOp::Max(), 2);
  EXPECT_EQ(out, (std::vector<uint8_t>{200, 2, 255}));
  std::vector<int32_t> x = {INT32_MAX, -5}, y = {1, 7}, z(2);
  const void* in32[2] = {x.data(), y.data()};
  ReduceInto(in32, 2, z.data(), 2, DType::kI32, ReduceOp::Sum(), 2);
  EXPECT_EQ(z[0], INT32_MIN);  // wraps, no UB
  ReduceInto(in32, 2, z.data(), 2, DType::kI32, ReduceOp::Min(), 2);
  EXPECT_EQ(z, (std::vector<int32_t>{1, -5}));
}

TEST(CastScale, StagingRoundTripsForHalfTypes) {
  const auto f = Random(4099, 8);
  std::vector<F16> h(f.size()), back(f.size());
  for (size_t i = 0; i < f.size(); ++i) h[i] = ToF16(f[i]);
  std::vector<float> staged(f.size());
  CastScale(h.data(), DType::kF16, staged.data(), DType::kF32, f.size(), {true, 0.5, 0});
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(staged[i], 0.5f * ToFloat(h[i]));
  CastScale(staged.data(), DType::kF32, back.data(), DType::kF16, f.size(), {false, 1.0, 3});
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(back[i].bits, ToF16(staged[i] / 3.0f).bits);
  std::vector<double> d = {1.0, 2.0}, d2(2);
  CastScale(d.data(), DType::kF64, d2.data(), DType::kF64, 2, {true, 0.1, 4});
  EXPECT_EQ(d2[0], 0.1 * 1.0 / 4.0);
}

}  // namespace
}  // namespace braid
