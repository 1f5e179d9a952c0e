// The fused CUDA AdamW / SGD kernels against the serial rules of optim/adamw_math.h, bit for bit
// (memcmp of p, m, v, the momentum buffer and the narrowed weights), over sizes that exercise
// the scalar head, the float4 body and the tail, misaligned buffers, every grad / out dtype and
// several steps. Argument errors are checked everywhere; the device tests skip without a GPU
// (CUDA error 35 or 100).
#include "optim/adamw_cuda.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/cuda_device.h"
#include "comm/dtype.h"
#include "comm/half.h"
#include "gtest/gtest.h"
#include "optim/adamw_math.h"
#include "optim/cuda_owners.h"

namespace braid::optim {
namespace {

static_assert(kCudaDTypeF32 == static_cast<int>(DType::kF32));
static_assert(kCudaDTypeBF16 == static_cast<int>(DType::kBF16));
static_assert(kCudaDTypeF16 == static_cast<int>(DType::kF16));

constexpr int kNoOut = -1;  // test-only marker: param_out not requested

// Device tests skip (not fail) when there is no device or no driver; any other reason a
// device cannot run the kernels (e.g. one older than sm_90) is a failure.
template <typename Base>
class GpuTest : public Base {
 protected:
  void SetUp() override {
    const int rc = CudaKernelDeviceStatus();
    if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
      GTEST_SKIP() << "no GPU: " << CudaErrorString(rc) << " (" << rc << ")";
    }
    ASSERT_EQ(rc, cudaSuccess) << CudaErrorString(rc);
  }
};

// ---- Host data and the reference --------------------------------------------------------------

size_t ElemSize(int dtype) { return dtype == kCudaDTypeF32 ? 4 : 2; }

const char* DTypeLabel(int dtype) {
  switch (dtype) {
    case kCudaDTypeF32:
      return "f32";
    case kCudaDTypeBF16:
      return "bf16";
    case kCudaDTypeF16:
      return "f16";
  }
  return "none";
}

// sign * [1, 2) * 2^e with e in [min_exp, max_exp]: values across many binades, so products
// and quotients land on subnormals and on rounding ties more often than uniform(-1, 1) would.
float RandomValue(std::mt19937& rng, int min_exp, int max_exp) {
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> exp(min_exp, max_exp);
  const float x = std::ldexp(mant(rng), exp(rng));
  return (rng() & 1u) ? -x : x;
}

// A gradient in storage (raw bytes of `dtype`) and widened exactly as the kernel widens it.
struct HostGrad {
  std::vector<uint8_t> raw;
  std::vector<float> wide;
};

HostGrad MakeGrad(std::mt19937& rng, size_t n, int dtype) {
  HostGrad g;
  g.raw.resize(n * ElemSize(dtype));
  g.wide.resize(n);
  for (size_t i = 0; i < n; ++i) {
    // Below 2^15 so f16 never overflows; the small end reaches f16 subnormals and zero.
    const float x = (i % 17 == 5) ? 0.0f : RandomValue(rng, -30, 14);
    if (dtype == kCudaDTypeF32) {
      g.wide[i] = x;
      std::memcpy(&g.raw[4 * i], &x, 4);
    } else if (dtype == kCudaDTypeBF16) {
      const BF16 h = ToBF16(x);
      g.wide[i] = ToFloat(h);
      std::memcpy(&g.raw[2 * i], &h.bits, 2);
    } else {
      const F16 h = ToF16(x);
      g.wide[i] = ToFloat(h);
      std::memcpy(&g.raw[2 * i], &h.bits, 2);
    }
  }
  return g;
}

// What param_out must hold: p narrowed as comm/half.h narrows.
std::vector<uint8_t> Narrowed(const std::vector<float>& p, int dtype) {
  std::vector<uint8_t> out(p.size() * ElemSize(dtype));
  for (size_t i = 0; i < p.size(); ++i) {
    if (dtype == kCudaDTypeF32) {
      std::memcpy(&out[4 * i], &p[i], 4);
    } else {
      const uint16_t bits = dtype == kCudaDTypeBF16 ? ToBF16(p[i]).bits : ToF16(p[i]).bits;
      std::memcpy(&out[2 * i], &bits, 2);
    }
  }
  return out;
}

// memcmp, and on a difference the first differing element with both bit patterns.
::testing::AssertionResult SameBits(const char* what, const void* want, const void* got, size_t n,
                                    size_t elem) {
  if (n == 0 || std::memcmp(want, got, n * elem) == 0) return ::testing::AssertionSuccess();
  const auto* w = static_cast<const uint8_t*>(want);
  const auto* g = static_cast<const uint8_t*>(got);
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(w + i * elem, g + i * elem, elem) == 0) continue;
    uint32_t wb = 0, gb = 0;
    std::memcpy(&wb, w + i * elem, elem);
    std::memcpy(&gb, g + i * elem, elem);
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s[%zu] of %zu: want 0x%08x, got 0x%08x", what, i, n, wb, gb);
    return ::testing::AssertionFailure() << buf;
  }
  return ::testing::AssertionFailure() << what << ": memcmp differs but no element does";
}

// One buffer on the device at an element offset from a 256-byte aligned allocation, so tests
// choose each buffer's alignment.
class Placed {
 public:
  cudaError_t Allocate(size_t n, size_t elem, size_t offset) {
    elem_ = elem;
    offset_ = offset;
    return owner_.Allocate((n + offset) * elem);
  }
  void* get() const { return owner_.get() + offset_ * elem_; }
  cudaError_t Upload(const void* src, size_t bytes) {
    return cudaMemcpy(get(), src, bytes, cudaMemcpyHostToDevice);
  }
  cudaError_t Download(void* dst, size_t bytes) const {
    return cudaMemcpy(dst, get(), bytes, cudaMemcpyDeviceToHost);
  }

 private:
  DeviceBuffer owner_;
  size_t elem_ = 1;
  size_t offset_ = 0;
};

// ---- AdamW, parameterized ---------------------------------------------------------------------

struct Layout {
  size_t n;
  // Element offsets of p, m / v, grad and param_out from an aligned base. Equal offsets keep
  // the float4 body (after a scalar head); unequal ones force the scalar path.
  size_t off_p, off_state, off_grad, off_out;
};

const Layout kLayouts[] = {
    {1, 0, 0, 0, 0},        {3, 0, 0, 0, 0},     {4, 0, 0, 0, 0},    {1000, 0, 0, 0, 0},
    {1u << 20, 0, 0, 0, 0}, {5, 2, 2, 2, 2},     {1001, 1, 1, 1, 1}, {4099, 3, 3, 3, 3},
    {1001, 1, 2, 3, 0},     {65537, 0, 0, 0, 1},
};

using AdamWCase = std::tuple<Layout, int, int>;  // layout, grad dtype, out dtype (or kNoOut)

class AdamWCudaMatchTest : public GpuTest<::testing::TestWithParam<AdamWCase>> {};

TEST_P(AdamWCudaMatchTest, MatchesHostLoopBitForBit) {
  const auto& [layout, grad_dtype, out_dtype] = GetParam();
  const size_t n = layout.n;
  std::mt19937 rng(1234 + static_cast<unsigned>(n));
  std::vector<float> p(n), m(n), v(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = RandomValue(rng, -20, 4);
    m[i] = (i % 7 == 0) ? 0.0f : RandomValue(rng, -30, 0);
    v[i] = (i % 7 == 0) ? 0.0f : std::fabs(RandomValue(rng, -60, 0));  // v >= 0
  }
  Placed dp, dm, dv, dg, dout;
  ASSERT_EQ(dp.Allocate(n, 4, layout.off_p), cudaSuccess);
  ASSERT_EQ(dm.Allocate(n, 4, layout.off_state), cudaSuccess);
  ASSERT_EQ(dv.Allocate(n, 4, layout.off_state), cudaSuccess);
  ASSERT_EQ(dg.Allocate(n, ElemSize(grad_dtype), layout.off_grad), cudaSuccess);
  const bool want_out = out_dtype != kNoOut;
  if (want_out) {
    ASSERT_EQ(dout.Allocate(n, ElemSize(out_dtype), layout.off_out), cudaSuccess);
  }
  ASSERT_EQ(dp.Upload(p.data(), 4 * n), cudaSuccess);
  ASSERT_EQ(dm.Upload(m.data(), 4 * n), cudaSuccess);
  ASSERT_EQ(dv.Upload(v.data(), 4 * n), cudaSuccess);

  AdamWHyper hyper;
  hyper.lr = 1e-2;
  hyper.beta2 = 0.95;
  hyper.weight_decay = 0.1;
  std::vector<float> got(n);
  std::vector<uint8_t> got_out;
  for (int step = 1; step <= 3; ++step) {
    const HostGrad g = MakeGrad(rng, n, grad_dtype);
    const AdamWScalars s = StepScalars(hyper, step, step == 2 ? 0.25 : 1.0);
    ASSERT_EQ(dg.Upload(g.raw.data(), g.raw.size()), cudaSuccess);
    ASSERT_EQ(AdamWCudaLaunch(s, static_cast<float*>(dp.get()), static_cast<float*>(dm.get()),
                              static_cast<float*>(dv.get()), dg.get(), grad_dtype, n,
                              want_out ? dout.get() : nullptr, out_dtype, nullptr),
              cudaSuccess);
    for (size_t i = 0; i < n; ++i) AdamWElement(s, g.wide[i], &p[i], &m[i], &v[i]);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_EQ(dp.Download(got.data(), 4 * n), cudaSuccess);
    ASSERT_TRUE(SameBits("p", p.data(), got.data(), n, 4));
    ASSERT_EQ(dm.Download(got.data(), 4 * n), cudaSuccess);
    ASSERT_TRUE(SameBits("m", m.data(), got.data(), n, 4));
    ASSERT_EQ(dv.Download(got.data(), 4 * n), cudaSuccess);
    ASSERT_TRUE(SameBits("v", v.data(), got.data(), n, 4));
    if (want_out) {
      const std::vector<uint8_t> want = Narrowed(p, out_dtype);
      got_out.resize(want.size());
      ASSERT_EQ(dout.Download(got_out.data(), got_out.size()), cudaSuccess);
      ASSERT_TRUE(SameBits("param_out", want.data(), got_out.data(), n, ElemSize(out_dtype)));
    }
  }
}

std::string AdamWCaseName(const ::testing::TestParamInfo<AdamWCase>& info) {
  const auto& [layout, grad_dtype, out_dtype] = info.param;
  return "n" + std::to_string(layout.n) + "_off" + std::to_string(layout.off_p) +
         std::to_string(layout.off_state) + std::to_string(layout.off_grad) +
         std::to_string(layout.off_out) + "_grad_" + DTypeLabel(grad_dtype) + "_out_" +
         DTypeLabel(out_dtype);
}

INSTANTIATE_TEST_SUITE_P(
    AllLayoutsAndDTypes, AdamWCudaMatchTest,
    ::testing::Combine(::testing::ValuesIn(kLayouts),
                       ::testing::Values(kCudaDTypeF32, kCudaDTypeBF16, kCudaDTypeF16),
                       ::testing::Values(kNoOut, kCudaDTypeF32, kCudaDTypeBF16, kCudaDTypeF16)),
    AdamWCaseName);

// ---- AdamW: a long run, the narrowing edge cases, a stream ------------------------------------

using AdamWCudaDeviceTest = GpuTest<::testing::Test>;

// 50 steps with bf16 gradients and bf16 weights on a non-default stream: state drifts far from
// its start, and a single differing rounding anywhere would compound and show.
TEST_F(AdamWCudaDeviceTest, FiftyStepsOnAStreamStayBitExact) {
  constexpr size_t kN = 10007;
  std::mt19937 rng(7);
  std::vector<float> p(kN), m(kN, 0.0f), v(kN, 0.0f);
  for (float& x : p) x = RandomValue(rng, -8, 1);
  Placed dp, dm, dv, dg, dout;
  ASSERT_EQ(dp.Allocate(kN, 4, 0), cudaSuccess);
  ASSERT_EQ(dm.Allocate(kN, 4, 0), cudaSuccess);
  ASSERT_EQ(dv.Allocate(kN, 4, 0), cudaSuccess);
  ASSERT_EQ(dg.Allocate(kN, 2, 0), cudaSuccess);
  ASSERT_EQ(dout.Allocate(kN, 2, 0), cudaSuccess);
  ASSERT_EQ(dp.Upload(p.data(), 4 * kN), cudaSuccess);
  ASSERT_EQ(dm.Upload(m.data(), 4 * kN), cudaSuccess);
  ASSERT_EQ(dv.Upload(v.data(), 4 * kN), cudaSuccess);
  Stream stream;
  ASSERT_EQ(stream.Create(), cudaSuccess);

  const AdamWHyper hyper;  // torch defaults with weight_decay 0.01
  for (int step = 1; step <= 50; ++step) {
    const HostGrad g = MakeGrad(rng, kN, kCudaDTypeBF16);
    const AdamWScalars s = StepScalars(hyper, step);
    // A plain cudaMemcpy does not order against a non-blocking stream: this upload is safe
    // because every step ends with cudaStreamSynchronize below.
    ASSERT_EQ(dg.Upload(g.raw.data(), g.raw.size()), cudaSuccess);
    ASSERT_EQ(AdamWCudaLaunch(s, static_cast<float*>(dp.get()), static_cast<float*>(dm.get()),
                              static_cast<float*>(dv.get()), dg.get(), kCudaDTypeBF16, kN,
                              dout.get(), kCudaDTypeBF16, stream.get()),
              cudaSuccess);
    for (size_t i = 0; i < kN; ++i) AdamWElement(s, g.wide[i], &p[i], &m[i], &v[i]);
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  }
  std::vector<float> got(kN);
  ASSERT_EQ(dp.Download(got.data(), 4 * kN), cudaSuccess);
  EXPECT_TRUE(SameBits("p", p.data(), got.data(), kN, 4));
  ASSERT_EQ(dm.Download(got.data(), 4 * kN), cudaSuccess);
  EXPECT_TRUE(SameBits("m", m.data(), got.data(), kN, 4));
  ASSERT_EQ(dv.Download(got.data(), 4 * kN), cudaSuccess);
  EXPECT_TRUE(SameBits("v", v.data(), got.data(), kN, 4));
  const std::vector<uint8_t> want = Narrowed(p, kCudaDTypeBF16);
  std::vector<uint8_t> got_out(want.size());
  ASSERT_EQ(dout.Download(got_out.data(), got_out.size()), cudaSuccess);
  EXPECT_TRUE(SameBits("param_out", want.data(), got_out.data(), kN, 2));
}

// With lr = 0 the step leaves every finite or infinite p as it is (p * 1 - 0 * q), so
// param_out is the narrowing of chosen bit patterns: ties, the f16 overflow and subnormal
// thresholds, f32 subnormals, infinities. (NaN is left out: GPU arithmetic returns the
// canonical NaN where x86 keeps a payload, see adamw_cuda.h.)
TEST_F(AdamWCudaDeviceTest, NarrowingEdgeCasesMatchHalfH) {
  std::vector<uint32_t> bits = {
      0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u,  // zeros, subnormals
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f7fffffu,               // bf16 ties and near
      0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,               // max, inf
      0x477fefffu, 0x477ff000u, 0x477fe000u, 0x47800000u,               // f16 overflow edge
      0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u, 0x33000001u,  // f16 subnormal edge
      0x3f801000u, 0x3f803000u, 0x3f800fffu, 0xbf803000u,               // f16 ties
  };
  std::mt19937 rng(99);
  while (bits.size() < 4096) {
    const uint32_t b = static_cast<uint32_t>(rng());
    if ((b & 0x7f800000u) != 0x7f800000u) bits.push_back(b);  // any finite pattern
  }
  const size_t n = bits.size();
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
  std::memcpy(p.data(), bits.data(), 4 * n);
  AdamWHyper hyper;
  hyper.lr = 0.0;
  const AdamWScalars s = StepScalars(hyper, 1);
  std::vector<float> g(n, 0.0f);
  for (size_t i = 0; i < n; ++i) g[i] = RandomValue(rng, -10, 10);

  for (const int out_dtype : {kCudaDTypeF32, kCudaDTypeBF16, kCudaDTypeF16}) {
    SCOPED_TRACE(DTypeLabel(out_dtype));
    Placed dp, dm, dv, dg, dout;
    ASSERT_EQ(dp.Allocate(n, 4, 0), cudaSuccess);
    ASSERT_EQ(dm.Allocate(n, 4, 0), cudaSuccess);
    ASSERT_EQ(dv.Allocate(n, 4, 0), cudaSuccess);
    ASSERT_EQ(dg.Allocate(n, 4, 0), cudaSuccess);
    ASSERT_EQ(dout.Allocate(n, ElemSize(out_dtype), 0), cudaSuccess);
    ASSERT_EQ(dp.Upload(p.data(), 4 * n), cudaSuccess);
    ASSERT_EQ(dm.Upload(m.data(), 4 * n), cudaSuccess);
    ASSERT_EQ(dv.Upload(v.data(), 4 * n), cudaSuccess);
    ASSERT_EQ(dg.Upload(g.data(), 4 * n), cudaSuccess);
    ASSERT_EQ(AdamWCudaLaunch(s, static_cast<float*>(dp.get()), static_cast<float*>(dm.get()),
                              static_cast<float*>(dv.get()), dg.get(), kCudaDTypeF32, n, dout.get(),
                              out_dtype, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> hp = p, hm = m, hv = v;
    for (size_t i = 0; i < n; ++i) AdamWElement(s, g[i], &hp[i], &hm[i], &hv[i]);
    const std::vector<uint8_t> want = Narrowed(hp, out_dtype);
    std::vector<uint8_t> got(want.size());
    ASSERT_EQ(dout.Download(got.data(), got.size()), cudaSuccess);
    EXPECT_TRUE(SameBits("param_out", want.data(), got.data(), n, ElemSize(out_dtype)));
  }
}

// ---- SGD ------------------------------------------------------------------------------------

using SgdCase = std::tuple<double, bool, int, size_t>;  // momentum, nesterov, grad dtype, offset

class SgdCudaMatchTest : public GpuTest<::testing::TestWithParam<SgdCase>> {};

TEST_P(SgdCudaMatchTest, MatchesHostLoopBitForBit) {
  const auto& [momentum, nesterov, grad_dtype, offset] = GetParam();
  constexpr size_t kN = 4099;
  std::mt19937 rng(5);
  std::vector<float> p(kN), buf(kN, 0.0f);
  for (float& x : p) x = RandomValue(rng, -20, 4);
  Placed dp, dbuf, dg, dout;
  ASSERT_EQ(dp.Allocate(kN, 4, offset), cudaSuccess);
  ASSERT_EQ(dbuf.Allocate(kN, 4, offset), cudaSuccess);
  ASSERT_EQ(dg.Allocate(kN, ElemSize(grad_dtype), offset), cudaSuccess);
  ASSERT_EQ(dout.Allocate(kN, 2, offset), cudaSuccess);
  ASSERT_EQ(dp.Upload(p.data(), 4 * kN), cudaSuccess);
  ASSERT_EQ(dbuf.Upload(buf.data(), 4 * kN), cudaSuccess);
  SgdHyper hyper;
  hyper.momentum = momentum;
  hyper.nesterov = nesterov;
  hyper.weight_decay = 1e-3;
  // With momentum 0 the buffer is optional: pass null to prove the kernel never touches it.
  float* const dbuf_arg = momentum != 0.0 ? static_cast<float*>(dbuf.get()) : nullptr;
  for (int step = 1; step <= 3; ++step) {
    const HostGrad g = MakeGrad(rng, kN, grad_dtype);
    const SgdScalars s = SgdStepScalars(hyper, step, step == 3 ? 0.5 : 1.0);
    ASSERT_EQ(dg.Upload(g.raw.data(), g.raw.size()), cudaSuccess);
    ASSERT_EQ(SgdCudaLaunch(s, static_cast<float*>(dp.get()), dbuf_arg, dg.get(), grad_dtype, kN,
                            dout.get(), kCudaDTypeF16, nullptr),
              cudaSuccess);
    for (size_t i = 0; i < kN; ++i) SgdElement(s, g.wide[i], &p[i], &buf[i]);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  std::vector<float> got(kN);
  ASSERT_EQ(dp.Download(got.data(), 4 * kN), cudaSuccess);
  EXPECT_TRUE(SameBits("p", p.data(), got.data(), kN, 4));
  if (momentum != 0.0) {
    ASSERT_EQ(dbuf.Download(got.data(), 4 * kN), cudaSuccess);
    EXPECT_TRUE(SameBits("buf", buf.data(), got.data(), kN, 4));
  }
  const std::vector<uint8_t> want = Narrowed(p, kCudaDTypeF16);
  std::vector<uint8_t> got_out(want.size());
  ASSERT_EQ(dout.Download(got_out.data(), got_out.size()), cudaSuccess);
  EXPECT_TRUE(SameBits("param_out", want.data(), got_out.data(), kN, 2));
}

INSTANTIATE_TEST_SUITE_P(MomentumAndDTypes, SgdCudaMatchTest,
                         ::testing::Combine(::testing::Values(0.0, 0.9), ::testing::Bool(),
                                            ::testing::Values(kCudaDTypeF32, kCudaDTypeBF16,
                                                              kCudaDTypeF16),
                                            ::testing::Values(size_t{0}, size_t{1})));

// ---- Argument errors: rejected before any CUDA call, so these run everywhere ------------------

// Host pointers stand in for device buffers: a rejected launch must never dereference them.
TEST(AdamWCudaArgs, NullOrBadArgumentsAreInvalidValue) {
  float host[4] = {};
  float* p = host;
  const AdamWScalars s = StepScalars(AdamWHyper{}, 1);
  constexpr int kInvalid = cudaErrorInvalidValue;
  EXPECT_EQ(AdamWCudaLaunch(s, nullptr, p, p, p, kCudaDTypeF32, 4, nullptr, 0, nullptr), kInvalid);
  EXPECT_EQ(AdamWCudaLaunch(s, p, nullptr, p, p, kCudaDTypeF32, 4, nullptr, 0, nullptr), kInvalid);
  EXPECT_EQ(AdamWCudaLaunch(s, p, p, nullptr, p, kCudaDTypeF32, 4, nullptr, 0, nullptr), kInvalid);
  EXPECT_EQ(AdamWCudaLaunch(s, p, p, p, nullptr, kCudaDTypeF32, 4, nullptr, 0, nullptr), kInvalid);
  // f64 and out-of-range dtypes, for the gradient and (when requested) for param_out.
  EXPECT_EQ(AdamWCudaLaunch(s, p, p, p, p, static_cast<int>(DType::kF64), 4, nullptr, 0, nullptr),
            kInvalid);
  EXPECT_EQ(AdamWCudaLaunch(s, p, p, p, p, 99, 0, nullptr, 0, nullptr), kInvalid);
  EXPECT_EQ(
      AdamWCudaLaunch(s, p, p, p, p, kCudaDTypeF32, 4, p, static_cast<int>(DType::kI32), nullptr),
      kInvalid);
  // n == 0 is a no-op that needs no buffers (and no device).
  EXPECT_EQ(AdamWCudaLaunch(s, nullptr, nullptr, nullptr, nullptr, kCudaDTypeBF16, 0, nullptr, 0,
                            nullptr),
            cudaSuccess);

  const SgdScalars sgd = SgdStepScalars(SgdHyper{}, 1);  // momentum 0.9: buf required
  EXPECT_EQ(SgdCudaLaunch(sgd, p, nullptr, p, kCudaDTypeF32, 4, nullptr, 0, nullptr), kInvalid);
  EXPECT_EQ(SgdCudaLaunch(sgd, nullptr, p, p, kCudaDTypeF32, 4, nullptr, 0, nullptr), kInvalid);
  EXPECT_EQ(SgdCudaLaunch(sgd, p, p, nullptr, kCudaDTypeF32, 4, nullptr, 0, nullptr), kInvalid);
  EXPECT_EQ(SgdCudaLaunch(sgd, p, p, p, 7, 4, nullptr, 0, nullptr), kInvalid);
  EXPECT_EQ(SgdCudaLaunch(sgd, nullptr, nullptr, nullptr, kCudaDTypeF16, 0, nullptr, 0, nullptr),
            cudaSuccess);
}

TEST(AdamWCudaArgs, DeviceStatusIsSuccessOrAKnownReason) {
  const int rc = CudaKernelDeviceStatus();
  EXPECT_TRUE(rc == cudaSuccess || rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver ||
              rc == cudaErrorNoKernelImageForDevice)
      << rc << ": " << CudaErrorString(rc);
  EXPECT_STRNE(CudaErrorString(cudaErrorInvalidValue), "");
}

}  // namespace
}  // namespace braid::optim
