// The CPU optimizer kernels (optim/adamw_kernel.h) against the serial rules of
// optim/adamw_math.h, bit for bit: every size class (empty, scalar tail only, one vector, vector
// body + tail), gradient dtype and param_out dtype, misaligned pointers, several steps (bias
// correction), weight decay, grad scale, every SGD variant, and 1/2/3 threads. Also: the f32
// rule against an f64 textbook AdamW, exact conversions (exhaustive over 16-bit inputs), the
// gradient norm's documented order, and inf/NaN detection at every position class.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "comm/half.h"
#include "gtest/gtest.h"
#include "optim/adamw_kernel.h"
#include "optim/adamw_math.h"
#include "optim/parallel_for.h"

namespace braid::optim {
namespace {

constexpr size_t kSizes[] = {0, 1, 7, 8, 15, 16, 17, 1000, 4099};
constexpr DType kGradTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
// kU8 stands for "no param_out" in the parameter lists below.
constexpr DType kOutTypes[] = {DType::kU8, DType::kF32, DType::kBF16, DType::kF16};

std::string Name(DType t) { return t == DType::kU8 ? "none" : std::string(DTypeName(t)); }

// Gradient elements stored as `dtype`, with their exact f32 values.
struct Grad {
  DType dtype;
  std::vector<uint16_t> storage;  // f32 uses two u16 per element; room for a misaligned start
  std::vector<float> wide;
  const void* data(size_t misalign) const {
    return reinterpret_cast<const char*>(storage.data()) + misalign * DTypeSize(dtype);
  }
};

// Magnitudes from 1e-9 to 10 (both signs, a few exact zeros) so eps, tiny and large updates and
// every conversion rounding path are exercised.
Grad RandomGrad(size_t n, DType dtype, uint32_t seed, size_t misalign = 0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> e(-9.0f, 1.0f);
  Grad g{dtype, std::vector<uint16_t>((n + misalign) * 2 + 1), std::vector<float>(n)};
  char* base = reinterpret_cast<char*>(g.storage.data()) + misalign * DTypeSize(dtype);
  for (size_t i = 0; i < n; ++i) {
    float x = std::pow(10.0f, e(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    if (rng() % 97 == 0) x = 0.0f;
    switch (dtype) {
      case DType::kF32:
        std::memcpy(base + 4 * i, &x, 4);
        g.wide[i] = x;
        break;
      case DType::kBF16: {
        const BF16 h = ToBF16(x);
        std::memcpy(base + 2 * i, &h, 2);
        g.wide[i] = ToFloat(h);
        break;
      }
      default: {
        const F16 h = ToF16(x);
        std::memcpy(base + 2 * i, &h, 2);
        g.wide[i] = ToFloat(h);
        break;
      }
    }
  }
  return g;
}

std::vector<float> RandomVec(size_t n, uint32_t seed, float lo, float hi, bool random_sign) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng) * ((random_sign && (rng() & 1)) ? -1.0f : 1.0f);
  return v;
}

// param_out as raw bytes, filled with a sentinel so untouched elements show.
std::vector<uint8_t> OutBuffer(size_t n, DType t) {
  return std::vector<uint8_t>((n + 1) * (t == DType::kU8 ? 1 : DTypeSize(t)), 0xAB);
}

// What the kernel must write at out[i] for master weight `x`.
void NarrowRef(std::vector<uint8_t>& out, DType t, size_t i, float x) {
  switch (t) {
    case DType::kF32:
      std::memcpy(out.data() + 4 * i, &x, 4);
      break;
    case DType::kBF16: {
      const BF16 h = ToBF16(x);
      std::memcpy(out.data() + 2 * i, &h, 2);
      break;
    }
    case DType::kF16: {
      const F16 h = ToF16(x);
      std::memcpy(out.data() + 2 * i, &h, 2);
      break;
    }
    default:
      break;
  }
}

::testing::AssertionResult SameBits(const std::vector<float>& got, const std::vector<float>& want,
                                    size_t n, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    if (FloatBits(got[i]) != FloatBits(want[i])) {
      return ::testing::AssertionFailure()
             << what << "[" << i << "] = " << got[i] << " (0x" << std::hex << FloatBits(got[i])
             << "), want " << want[i] << " (0x" << FloatBits(want[i]) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult SameBytes(const std::vector<uint8_t>& got,
                                     const std::vector<uint8_t>& want, const char* what) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure()
             << what << " byte " << i << " = " << int{got[i]} << ", want " << int{want[i]};
    }
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------------------------
// AdamW: vector path and scalar path vs the AdamWElement loop.

using KernelParam = std::tuple<size_t, DType, DType>;

std::string ParamName(const ::testing::TestParamInfo<KernelParam>& info) {
  const auto [n, g, o] = info.param;
  return "n" + std::to_string(n) + "_g" + Name(g) + "_out" + Name(o);
}

class AdamWKernel : public ::testing::TestWithParam<KernelParam> {};

TEST_P(AdamWKernel, MatchesElementRuleBitForBitOverSteps) {
  const auto [n, grad_type, out_type] = GetParam();
  const bool has_out = out_type != DType::kU8;
  for (const double wd : {0.0, 0.01}) {
    for (const double grad_scale : {1.0, 0.37}) {
      for (const size_t misalign : {size_t{0}, size_t{1}}) {
        SCOPED_TRACE("wd=" + std::to_string(wd) + " grad_scale=" + std::to_string(grad_scale) +
                     " misalign=" + std::to_string(misalign));
        const AdamWHyper h{/*lr=*/2e-3, 0.9, 0.999, 1e-8, wd};
        // Vector path (v_), scalar path (s_) and the reference loop (r_) on identical state; m
        // and v start non-zero so step 1 is not a special case by accident.
        const size_t cap = n + misalign;
        std::vector<float> vp = RandomVec(cap, 1, 0.01f, 2.0f, true),
                           vm = RandomVec(cap, 2, 0, 1e-3f, true),
                           vv = RandomVec(cap, 3, 0, 1e-5f, false);
        std::vector<float> sp = vp, sm = vm, sv = vv, rp = vp, rm = vm, rv = vv;
        for (const int64_t step : {1, 2, 3, 4, 1000}) {
          const AdamWScalars s = StepScalars(h, step, grad_scale);
          const Grad g = RandomGrad(n, grad_type, static_cast<uint32_t>(100 + step), misalign);
          std::vector<uint8_t> vout = OutBuffer(cap, out_type), sout = vout, rout = vout;
          const size_t osz = has_out ? DTypeSize(out_type) : 0;
          AdamWRange(s, vp.data() + misalign, vm.data() + misalign, vv.data() + misalign,
                     g.data(misalign), grad_type, n,
                     has_out ? vout.data() + misalign * osz : nullptr, out_type);
          AdamWRangeScalar(s, sp.data() + misalign, sm.data() + misalign, sv.data() + misalign,
                           g.data(misalign), grad_type, n,
                           has_out ? sout.data() + misalign * osz : nullptr, out_type);
          for (size_t i = 0; i < n; ++i) {
            const size_t k = i + misalign;
            AdamWElement(s, g.wide[i], &rp[k], &rm[k], &rv[k]);
            NarrowRef(rout, out_type, k, rp[k]);
          }
          SCOPED_TRACE("step " + std::to_string(step));
          ASSERT_TRUE(SameBits(vp, rp, cap, "vector p"));
          ASSERT_TRUE(SameBits(vm, rm, cap, "vector m"));
          ASSERT_TRUE(SameBits(vv, rv, cap, "vector v"));
          ASSERT_TRUE(SameBytes(vout, rout, "vector param_out"));
          ASSERT_TRUE(SameBits(sp, rp, cap, "scalar p"));
          ASSERT_TRUE(SameBits(sm, rm, cap, "scalar m"));
          ASSERT_TRUE(SameBits(sv, rv, cap, "scalar v"));
          ASSERT_TRUE(SameBytes(sout, rout, "scalar param_out"));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, AdamWKernel,
                         ::testing::Combine(::testing::ValuesIn(kSizes),
                                            ::testing::ValuesIn(kGradTypes),
                                            ::testing::ValuesIn(kOutTypes)),
                         ParamName);

// ---------------------------------------------------------------------------------------------
// SGD: every variant (no momentum, momentum, nesterov; first step and later) vs SgdElement.

class SgdKernel : public ::testing::TestWithParam<KernelParam> {};

TEST_P(SgdKernel, MatchesElementRuleBitForBit) {
  const auto [n, grad_type, out_type] = GetParam();
  const bool has_out = out_type != DType::kU8;
  const size_t osz = has_out ? DTypeSize(out_type) : 0;
  for (const double momentum : {0.0, 0.9}) {
    for (const bool nesterov : {false, true}) {
      for (const double wd : {0.0, 1e-4}) {
        SCOPED_TRACE("momentum=" + std::to_string(momentum) +
                     " nesterov=" + std::to_string(nesterov) + " wd=" + std::to_string(wd));
        const SgdHyper h{/*lr=*/0.05, momentum, wd, nesterov};
        std::vector<float> vp = RandomVec(n + 1, 4, 0.01f, 2.0f, true),
                           vb = RandomVec(n + 1, 5, 0, 1, true);
        std::vector<float> sp = vp, sb = vb, rp = vp, rb = vb;
        for (const int64_t step : {1, 2, 3}) {
          const SgdScalars s = SgdStepScalars(h, step, /*grad_scale=*/0.5);
          const Grad g = RandomGrad(n, grad_type, static_cast<uint32_t>(200 + step), 1);
          std::vector<uint8_t> vout = OutBuffer(n + 1, out_type), sout = vout, rout = vout;
          // With momentum 0 the buffer must not be needed: pass null.
          float* vbuf = momentum == 0.0 ? nullptr : vb.data() + 1;
          float* sbuf = momentum == 0.0 ? nullptr : sb.data() + 1;
          SgdRange(s, vp.data() + 1, vbuf, g.data(1), grad_type, n,
                   has_out ? vout.data() + osz : nullptr, out_type);
          SgdRangeScalar(s, sp.data() + 1, sbuf, g.data(1), grad_type, n,
                         has_out ? sout.data() + osz : nullptr, out_type);
          for (size_t i = 0; i < n; ++i) {
            SgdElement(s, g.wide[i], &rp[i + 1], &rb[i + 1]);
            NarrowRef(rout, out_type, i + 1, rp[i + 1]);
          }
          SCOPED_TRACE("step " + std::to_string(step));
          ASSERT_TRUE(SameBits(vp, rp, n + 1, "vector p"));
          ASSERT_TRUE(SameBytes(vout, rout, "vector param_out"));
          ASSERT_TRUE(SameBits(sp, rp, n + 1, "scalar p"));
          ASSERT_TRUE(SameBytes(sout, rout, "scalar param_out"));
          if (momentum != 0.0) {
            ASSERT_TRUE(SameBits(vb, rb, n + 1, "vector buf"));
            ASSERT_TRUE(SameBits(sb, rb, n + 1, "scalar buf"));
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, SgdKernel,
                         ::testing::Combine(::testing::ValuesIn(kSizes),
                                            ::testing::ValuesIn(kGradTypes),
                                            ::testing::ValuesIn(kOutTypes)),
                         ParamName);

// ---------------------------------------------------------------------------------------------
// Conversions: exhaustive over 16-bit gradients (widening) and a sweep of f32 bit patterns
// (narrowing), NaNs, infinities and subnormals included, through the fused kernels.

TEST(KernelConversions, WideningEveryHalfGradientIsExact) {
  // SGD with lr = 1, p = 0, no momentum, no decay: p = 0 - 1 * (g * 1) = -g exactly.
  constexpr size_t n = 65536;
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < n; ++i) bits[i] = static_cast<uint16_t>(i);
  const SgdScalars s = SgdStepScalars(SgdHyper{1.0, 0.0, 0.0, false}, 1);
  for (const DType t : {DType::kBF16, DType::kF16}) {
    std::vector<float> vp(n, 0.0f), rp(n, 0.0f);
    SgdRange(s, vp.data(), nullptr, bits.data(), t, n);
    for (size_t i = 0; i < n; ++i) {
      const float g = t == DType::kBF16 ? ToFloat(BF16{bits[i]}) : ToFloat(F16{bits[i]});
      SgdElement(s, g, &rp[i], nullptr);
    }
    ASSERT_TRUE(SameBits(vp, rp, n, DTypeName(t).data()));
  }
}

TEST(KernelConversions, NarrowingMatchesHalfH) {
  // SGD with lr = 0 and a zero gradient leaves finite p as is, so param_out is the rounding of
  // (almost) arbitrary f32 bit patterns: every 251st pattern, plus the rounding boundaries.
  std::vector<float> p;
  for (uint64_t u = 0; u <= 0xffffffffu; u += 251) p.push_back(BitsFloat(static_cast<uint32_t>(u)));
  for (const uint32_t u :
       {0x477fefffu, 0x477ff000u, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u, 0x7f800000u,
        0x7fc00000u, 0x7f800001u, 0xff800000u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu}) {
    p.push_back(BitsFloat(u));
    p.push_back(BitsFloat(u | 0x80000000u));
  }
  const size_t n = p.size();
  const std::vector<uint16_t> zero_grad(n, 0);
  const SgdScalars s = SgdStepScalars(SgdHyper{0.0, 0.0, 0.0, false}, 1);
  for (const DType t : {DType::kBF16, DType::kF16}) {
    std::vector<float> vp = p, rp = p;
    std::vector<uint8_t> vout = OutBuffer(n, t), rout = vout;
    SgdRange(s, vp.data(), nullptr, zero_grad.data(), DType::kBF16, n, vout.data(), t);
    for (size_t i = 0; i < n; ++i) {
      SgdElement(s, 0.0f, &rp[i], nullptr);
      NarrowRef(rout, t, i, rp[i]);
    }
    ASSERT_TRUE(SameBits(vp, rp, n, "p"));
    ASSERT_TRUE(SameBytes(vout, rout, DTypeName(t).data()));
  }
}

// ---------------------------------------------------------------------------------------------
// Threads: chunking, and bit-identical results for 1, 2 and 3 threads.

TEST(KernelPool, ChunksCoverTheRangeOnceOnSixteenElementBoundaries) {
  for (const int threads : {1, 2, 3, 4, 7}) {
    for (const size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{100}, size_t{1000},
                           size_t{4099}, size_t{1} << 20}) {
      for (const size_t grain : {size_t{0}, size_t{1}, size_t{16}, size_t{300}, n}) {
        size_t next = 0;
        for (int part = 0; part < threads; ++part) {
          const KernelPool::Range r = KernelPool::Chunk(n, grain, threads, part);
          ASSERT_LE(r.lo, r.hi);
          if (r.lo == r.hi) continue;
          ASSERT_EQ(r.lo, next) << "threads " << threads << " n " << n << " grain " << grain;
          ASSERT_EQ(r.lo % kKernelAlign, 0u);
          if (r.hi != n) {
            ASSERT_EQ(r.hi % kKernelAlign, 0u);
            if (grain > 0) {
              ASSERT_GE(r.hi - r.lo, grain);
            }
          }
          next = r.hi;
        }
        ASSERT_EQ(next, n);
      }
    }
  }
}

TEST(KernelPool, EveryElementVisitedOnceAcrossManyCallsAndIdleGaps) {
  for (const int threads : {1, 2, 3}) {
    auto pool_ptr = KernelPool::Create(threads).value();
    KernelPool& pool = *pool_ptr;
    std::vector<std::atomic<int>> hits(10000);
    for (int call = 0; call < 300; ++call) {
      const size_t n = 1 + static_cast<size_t>(call) * 33 % hits.size();
      pool.ParallelFor(n, 64, [&](size_t lo, size_t hi) {
        for (size_t i = lo; i < hi; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
      });
      for (size_t i = 0; i < hits.size(); ++i) {
        ASSERT_EQ(hits[i].exchange(0), i < n ? 1 : 0) << "call " << call << " i " << i;
      }
      // Now and then let the workers fall asleep, so the sleeping hand-off is covered too.
      if (call % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

TEST(KernelPool, AdamWAndSgdIdenticalForOneTwoThreeThreads) {
  const AdamWHyper h{1e-3, 0.9, 0.999, 1e-8, 0.01};
  for (const size_t n : {size_t{1000}, size_t{4099}, size_t{100003}}) {
    for (const DType gt : kGradTypes) {
      const Grad g = RandomGrad(n, gt, 7);
      const std::vector<float> p0 = RandomVec(n, 8, 0.01f, 2.0f, true);
      std::vector<float> want_p = p0, want_m(n, 0.0f), want_v(n, 0.0f);
      std::vector<uint16_t> want_out(n);
      for (int64_t step = 1; step <= 3; ++step) {
        AdamWRange(StepScalars(h, step, 0.5), want_p.data(), want_m.data(), want_v.data(),
                   g.data(0), gt, n, want_out.data(), DType::kBF16);
      }
      std::vector<float> want_sp = p0, want_sb(n, 0.0f);
      for (int64_t step = 1; step <= 3; ++step) {
        SgdRange(SgdStepScalars(SgdHyper{0.01, 0.9, 1e-4, true}, step), want_sp.data(),
                 want_sb.data(), g.data(0), gt, n);
      }
      for (const int threads : {1, 2, 3}) {
        SCOPED_TRACE("n " + std::to_string(n) + " threads " + std::to_string(threads));
        auto pool_ptr = KernelPool::Create(threads).value();
        KernelPool& pool = *pool_ptr;
        std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
        std::vector<uint16_t> out(n);
        for (int64_t step = 1; step <= 3; ++step) {
          // A small grain so even n = 1000 is split.
          AdamWParallel(pool, StepScalars(h, step, 0.5), p.data(), m.data(), v.data(), g.data(0),
                        gt, n, out.data(), DType::kBF16, /*grain=*/100);
        }
        ASSERT_TRUE(SameBits(p, want_p, n, "p"));
        ASSERT_TRUE(SameBits(m, want_m, n, "m"));
        ASSERT_TRUE(SameBits(v, want_v, n, "v"));
        ASSERT_EQ(out, want_out);
        std::vector<float> sp = p0, sb(n, 0.0f);
        for (int64_t step = 1; step <= 3; ++step) {
          SgdParallel(pool, SgdStepScalars(SgdHyper{0.01, 0.9, 1e-4, true}, step), sp.data(),
                      sb.data(), g.data(0), gt, n, nullptr, DType::kF32, /*grain=*/100);
        }
        ASSERT_TRUE(SameBits(sp, want_sp, n, "sgd p"));
        ASSERT_TRUE(SameBits(sb, want_sb, n, "sgd buf"));
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The f32 rule against AdamW in f64 as torch documents it (decay applied first, then the
// bias-corrected moments). Over 10 steps the f32 master weights stay within 2e-6 relative of
// f64 (f32 carries ~6e-8 per rounding), and the accumulated update p - p0 within 1e-4 of
// itself plus two f32 roundings of p per step.

TEST(AdamWMath, TracksFloat64TextbookAdamWWithinTolerance) {
  constexpr size_t n = 4099;
  for (const double wd : {0.0, 0.1}) {
    for (const double grad_scale : {1.0, 0.25}) {
      const AdamWHyper h{1e-3, 0.9, 0.999, 1e-8, wd};
      const std::vector<float> p0 = RandomVec(n, 9, 0.1f, 2.0f, true);
      std::vector<float> p = p0, m(n, 0.0f), v(n, 0.0f);
      std::vector<double> dp(p0.begin(), p0.end()), dm(n, 0.0), dv(n, 0.0);
      for (int64_t t = 1; t <= 10; ++t) {
        // A gradient with a consistent sign component plus noise, as in training.
        const Grad g = RandomGrad(n, DType::kF32, static_cast<uint32_t>(300 + t));
        AdamWRange(StepScalars(h, t, grad_scale), p.data(), m.data(), v.data(), g.data(0),
                   DType::kF32, n);
        for (size_t i = 0; i < n; ++i) {
          const double gi = static_cast<double>(g.wide[i]) * grad_scale;
          dp[i] -= h.lr * h.weight_decay * dp[i];
          dm[i] = h.beta1 * dm[i] + (1 - h.beta1) * gi;
          dv[i] = h.beta2 * dv[i] + (1 - h.beta2) * gi * gi;
          const double m_hat = dm[i] / (1 - std::pow(h.beta1, static_cast<double>(t)));
          const double v_hat = dv[i] / (1 - std::pow(h.beta2, static_cast<double>(t)));
          dp[i] -= h.lr * m_hat / (std::sqrt(v_hat) + h.eps);
        }
      }
      double worst_p = 0, worst_update = 0;
      for (size_t i = 0; i < n; ++i) {
        worst_p = std::max(worst_p, std::abs(p[i] - dp[i]) / std::abs(dp[i]));
        const double du = dp[i] - p0[i];
        const double fu = static_cast<double>(p[i]) - p0[i];
        // Allowed: 1e-4 of the update, plus two roundings of p per step (the decay product and
        // the subtraction, 2^-24 relative each).
        const double allowed = 1e-4 * std::abs(du) + 20 * std::ldexp(std::abs(dp[i]), -24);
        worst_update = std::max(worst_update, std::abs(fu - du) / allowed);
      }
      EXPECT_LE(worst_p, 2e-6) << "wd " << wd << " scale " << grad_scale;
      EXPECT_LE(worst_update, 1.0) << "wd " << wd << " scale " << grad_scale;
      std::printf(
          "wd %g scale %g: worst relative p error %.3g, worst update error / allowed %.3g\n", wd,
          grad_scale, worst_p, worst_update);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Gradient statistics.

// The order adamw_kernel.h documents, written out plainly.
double DocumentedOrderNorm(const std::vector<float>& x) {
  double total = 0.0;
  for (size_t lo = 0; lo < x.size(); lo += kNormBlock) {
    double lane[16] = {};
    for (size_t i = lo; i < std::min(x.size(), lo + kNormBlock); ++i) {
      lane[(i - lo) % 16] += static_cast<double>(x[i]) * x[i];
    }
    for (size_t w = 16; w > 1; w /= 2) {
      for (size_t j = 0; j < w / 2; ++j) lane[j] = lane[2 * j] + lane[2 * j + 1];
    }
    total += lane[0];
  }
  return total;
}

TEST(SquaredNormF64, MatchesDocumentedOrderExactlyAndNaiveSumClosely) {
  for (const size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{4095},
                         size_t{4096}, size_t{4097}, 3 * kNormBlock + 5, (size_t{1} << 20) + 3}) {
    for (const DType t : kGradTypes) {
      const Grad g = RandomGrad(n, t, 11, 1);  // misaligned by one element
      double naive = 0.0;
      for (const float x : g.wide) naive += static_cast<double>(x) * x;
      const double got = SquaredNormF64(g.data(1), t, n);
      EXPECT_EQ(got, DocumentedOrderNorm(g.wide)) << "n " << n << " " << DTypeName(t);
      // Positive terms: the relative error of any order is below n * 2^-53.
      EXPECT_NEAR(got, naive, 1e-12 * naive) << "n " << n << " " << DTypeName(t);
    }
  }
}

TEST(SquaredNormF64, SameBitsForAnyThreadCount) {
  const size_t n = 5 * 1000 * 1000 + 123;  // several hand-off groups, a short last block
  for (const DType t : kGradTypes) {
    const Grad g = RandomGrad(n, t, 12);
    const double serial = SquaredNormF64(g.data(0), t, n);
    for (const int threads : {1, 2, 3}) {
      auto pool_ptr = KernelPool::Create(threads).value();
      KernelPool& pool = *pool_ptr;
      EXPECT_EQ(SquaredNormF64(pool, g.data(0), t, n), serial) << threads << " threads";
    }
  }
}

TEST(SquaredNormF64, NonFiniteGradientGivesNonFiniteNorm) {
  std::vector<float> x(100, 1.0f);
  x[50] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(SquaredNormF64(x.data(), DType::kF32, x.size())));
  x[50] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(SquaredNormF64(x.data(), DType::kF32, x.size())));
}

// Writes `value` (given as f32) at element i of a `t` array.
void Put(std::vector<uint8_t>& buf, DType t, size_t i, float value) {
  switch (t) {
    case DType::kF32:
      std::memcpy(buf.data() + 4 * i, &value, 4);
      break;
    case DType::kBF16: {
      const BF16 h = ToBF16(value);
      std::memcpy(buf.data() + 2 * i, &h, 2);
      break;
    }
    default: {
      const F16 h = ToF16(value);
      std::memcpy(buf.data() + 2 * i, &h, 2);
      break;
    }
  }
}

TEST(AllFinite, DetectsInfAndNanAtEveryPositionClass) {
  const float bad_values[] = {std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), -BitsFloat(0x7fa00001u)};
  for (const DType t : kGradTypes) {
    for (const size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{16}, size_t{17}, size_t{255},
                           size_t{256}, size_t{257}, size_t{1000}, size_t{4099}}) {
      // Finite extremes everywhere else: the largest normal, subnormals, -0.
      std::vector<uint8_t> buf(n * DTypeSize(t));
      const float big = t == DType::kF32 ? 3.4e38f : t == DType::kBF16 ? 3.38e38f : 65504.0f;
      const float fill[] = {big, -big, -0.0f, 1e-40f, 6e-8f, 1.0f};
      for (size_t i = 0; i < n; ++i) Put(buf, t, i, fill[i % 6]);
      ASSERT_TRUE(AllFinite(buf.data(), t, n)) << DTypeName(t) << " n " << n;
      // Head, inside the vector body, last element of a chunk/vector, and the tail.
      const size_t positions[] = {0, n / 2, std::min(n - 1, size_t{255}), n - 1};
      for (const size_t pos : positions) {
        for (const float bad : bad_values) {
          std::vector<uint8_t> b = buf;
          Put(b, t, pos, bad);
          ASSERT_FALSE(AllFinite(b.data(), t, n))
              << DTypeName(t) << " n " << n << " pos " << pos << " value " << bad;
        }
      }
    }
  }
  EXPECT_TRUE(AllFinite(nullptr, DType::kF32, 0));
}

}  // namespace
}  // namespace braid::optim
