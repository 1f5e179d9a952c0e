// Quantized parameter all-gathers (GathererConfig::quant, ZeRO++'s qwZ) on the local backend.
// The codec against values fixed by the formats (E4M3 by brute force over its value table, built
// here from the format's definition; bf16 / f16 casts against the nearest values); the gathered
// buckets at 1, 2 and 4 ranks against a serial reference that quantizes every rank's shard the
// same way, written here independently, bit for bit on every rank; the shard (the optimizer's
// master weights) left exact; staging memory returned; bad settings refused by name.
#include "scheduler/gather_quant.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "gtest/gtest.h"
#include "scheduler/memory_stats.h"
#include "scheduler/param_gatherer.h"
#include "scheduler/unit_scheduler.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// E4M3 from its definition: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal; S.1111.111 is NaN; no infinities.
float E4M3Value(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
  return static_cast<float>((code & 0x80) ? -mag : mag);
}

// The E4M3 code nearest to x by brute force (ties: the even code), saturating at 448.
uint8_t E4M3Nearest(float x) {
  const float a = std::fabs(x);
  int best = 0;
  for (int c = 1; c < 0x7f; ++c) {
    const double d = std::fabs(E4M3Value(c) - static_cast<double>(a));
    const double db = std::fabs(E4M3Value(best) - static_cast<double>(a));
    if (d < db || (d == db && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

TEST(GatherQuantCodec, Fp8E4M3MatchesTheFormat) {
  for (int c = 0; c < 256; ++c) {
    const float v = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(Bits(v), Bits(E4M3Value(c))) << "code " << c;
    EXPECT_EQ(Fp8E4M3FromFloat(v), c) << "round trip of code " << c;
  }
  EXPECT_EQ(Fp8E4M3FromFloat(1.0f), 0x38);
  EXPECT_EQ(Fp8E4M3FromFloat(448.0f), 0x7e);
  EXPECT_EQ(Fp8E4M3FromFloat(-1e9f), 0xfe);               // saturates
  EXPECT_EQ(Fp8E4M3FromFloat(464.0f), 0x7e);              // halfway to 480 (no such value)
  EXPECT_EQ(Fp8E4M3FromFloat(1.0625f), 0x38);             // tie between 1 and 1.125: even
  EXPECT_EQ(Fp8E4M3FromFloat(1.1875f), 0x3a);             // tie between 1.125 and 1.25: even
  EXPECT_EQ(Fp8E4M3FromFloat(std::ldexp(1.0f, -10)), 0);  // tie between 0 and 2^-9: even
  EXPECT_EQ(Fp8E4M3FromFloat(std::ldexp(3.0f, -10)), 2);  // 1.5 x 2^-9 -> 2 x 2^-9
  EXPECT_EQ(Fp8E4M3FromFloat(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  // Every float between the codes: the brute-force nearest.
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(static_cast<float>(i % 997) / 997.0f + 0.37f, i % 20 - 11) *
                    (i % 3 == 0 ? -1.0f : 1.0f);
    ASSERT_EQ(Fp8E4M3FromFloat(x), E4M3Nearest(x)) << x;
  }
}

TEST(GatherQuantCodec, NonFiniteBlocksDecodeToNaN) {
  for (GatherDType t : {GatherDType::kInt8, GatherDType::kFp8E4M3}) {
    const GatherQuant q{t, 4};
    const float x[8] = {1, 2, std::numeric_limits<float>::infinity(), 3, 0, 0, 0, 0};
    std::vector<uint8_t> rec(QuantRecordBytes(q, 8));
    ASSERT_EQ(rec.size(), 2 * 4 + 8u);
    QuantizeBlocks(q, x, 8, rec.data());
    float out[8];
    DequantizeBlocks(q, rec.data(), 8, out);
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(std::isnan(out[i])) << GatherDTypeName(t) << " " << i;
    for (int i = 4; i < 8; ++i) EXPECT_EQ(out[i], 0.0f) << GatherDTypeName(t) << " " << i;
  }
}

// ---- the gatherer ----------------------------------------------------------------------

std::vector<ParamSpec> F32Params() {
  const size_t sizes[] = {1, 37, 300, 1025, 64, 13, 4099, 7, 515, 3, 129};
  std::vector<ParamSpec> ps;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    ps.push_back(ParamSpec{static_cast<ParamId>(10 + i), sizes[i], DType::kF32, Device::Cpu(),
                           absl::StrCat("layer", i, ".weight")});
  }
  return ps;
}

BucketPlan MakePlan(std::vector<ParamSpec> params, int shards) {
  PlanOptions o;
  o.shards = shards;
  o.first_bucket_cap_bytes = 1024;
  o.bucket_cap_bytes = 8192;
  auto plan = BucketPlan::Build(std::move(params), o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// What rank r's shard of bucket b holds in round k: weights of varied magnitude, exact zeroes
// and a whole zero run (a zero block) included.
float ShardValue(int r, int b, size_t j, int k) {
  if (j % 97 == 5) return 0.0f;
  if (j >= 200 && j < 232) return 0.0f;
  const double phase = 0.37 * static_cast<double>(j) + 1.3 * r + 0.7 * b + 2.1 * k;
  return static_cast<float>(std::sin(phase) * std::pow(10.0, static_cast<int>((j / 50) % 5) - 3));
}

// The bf16 value nearest to x, ties to the even mantissa (x finite): of the two bf16 values
// around it (x's bits truncated, and the next one up), by distance in double.
float NearestBf16(float x) {
  const uint32_t down = Bits(x) & 0xffff0000u, up = down + 0x10000u;
  float lo, hi;
  std::memcpy(&lo, &down, 4);
  std::memcpy(&hi, &up, 4);
  const double dl = std::fabs(static_cast<double>(x) - lo),
               dh = std::fabs(static_cast<double>(hi) - x);
  return dl < dh || (dl == dh && (down & 0x10000u) == 0) ? lo : hi;
}

// Serial reference of one shard through the wire: per block, scale = amax / qmax, value =
// code * scale, code = round-half-even(x / scale) clamped (int8) or the nearest E4M3 (fp8);
// bf16 / f16: each value rounded to the nearest (f16: the compiler's _Float16 conversion).
std::vector<float> ReferenceShard(const GatherQuant& q, int r, int b, size_t count, int k) {
  std::vector<float> out(count);
  if (IsCastGather(q.dtype)) {
    for (size_t j = 0; j < count; ++j) {
      const float x = ShardValue(r, b, j, k);
      out[j] = q.dtype == GatherDType::kBF16 ? NearestBf16(x)
                                             : static_cast<float>(static_cast<_Float16>(x));
    }
    return out;
  }
  const float qmax = q.dtype == GatherDType::kInt8 ? 127.0f : 448.0f;
  for (size_t lo = 0; lo < count; lo += q.block) {
    const size_t hi = std::min(count, lo + static_cast<size_t>(q.block));
    float amax = 0.0f;
    for (size_t j = lo; j < hi; ++j) amax = std::max(amax, std::fabs(ShardValue(r, b, j, k)));
    const float scale = amax / qmax;
    for (size_t j = lo; j < hi; ++j) {
      const float v = scale > 0.0f ? ShardValue(r, b, j, k) / scale : 0.0f;
      const float code = q.dtype == GatherDType::kInt8
                             ? static_cast<float>(static_cast<int>(  // an integer: no -0
                                   std::fmax(-127.0f, std::fmin(127.0f, std::nearbyint(v)))))
                             : E4M3Value(E4M3Nearest(v));
      out[j] = code * scale;
    }
  }
  return out;
}

struct Case {
  int ranks;
  GatherDType dtype;
  int block;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.ranks << " ranks, " << GatherDTypeName(c.dtype) << ", block " << c.block;
}

class QuantizedGather : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizedGather, MatchesSerialReferenceBitForBit) {
  const Case c = GetParam();
  RunRanks(c.ranks, [&](Group& g) {
    const int me = g.rank();
    MemoryStats memory;
    GathererConfig gc;
    gc.timeout = absl::Seconds(60);
    gc.fully_sharded = true;
    gc.memory = &memory;
    gc.quant = {c.dtype, c.block};
    auto made = ParamGatherer::Create(MakePlan(F32Params(), c.ranks), &g, gc);
    ASSERT_TRUE(made.ok()) << made.status();
    ParamGatherer& pg = **made;
    const BucketPlan& plan = pg.plan();
    ASSERT_GE(pg.num_buckets(), 3);
    for (int k = 0; k < 2; ++k) {  // round 1: an optimizer step wrote new shards
      for (int b = 0; b < pg.num_buckets(); ++b) {
        auto sv = pg.ShardView(b);
        ASSERT_TRUE(sv.ok());
        float* p = static_cast<float*>(sv->data);
        for (size_t j = 0; j < sv->count; ++j) p[j] = ShardValue(me, b, j, k);
      }
      for (int b = 0; b < pg.num_buckets(); ++b) ASSERT_OK(pg.Prefetch(b));
      ASSERT_OK(pg.WaitAll());
      for (int b = 0; b < pg.num_buckets(); ++b) {
        const Bucket& bk = plan.buckets()[b];
        std::vector<float> want;
        for (int r = 0; r < c.ranks; ++r) {
          std::vector<float> s = ReferenceShard(gc.quant, r, b, bk.shard_count, k);
          want.insert(want.end(), s.begin(), s.end());
        }
        for (int p : bk.params) {
          auto v = pg.ParamView(plan.params()[p].id);
          ASSERT_TRUE(v.ok()) << v.status();
          const float* got = static_cast<const float*>(v->data);
          for (size_t j = 0; j < v->count; ++j) {
            ASSERT_EQ(Bits(got[j]), Bits(want[plan.slot(p).offset + j]))
                << "rank " << me << ", round " << k << ", " << plan.params()[p].Label()
                << " element " << j;
          }
        }
        // The shard stays exact (the optimizer's master weights are never quantized).
        const float* shard = static_cast<const float*>(pg.ShardView(b)->data);
        for (size_t j = 0; j < bk.shard_count; ++j)
          ASSERT_EQ(Bits(shard[j]), Bits(ShardValue(me, b, j, k))) << "bucket " << b;
        ASSERT_OK(pg.Release(b));
      }
      EXPECT_EQ(memory.Snapshot().by_use[static_cast<int>(MemoryUse::kStaging)].current, 0);
    }
    // The wire is smaller: the staging peak is about a quarter of the largest bucket.
    const MemorySnapshot snap = memory.Snapshot();
    EXPECT_GT(snap.by_use[static_cast<int>(MemoryUse::kStaging)].peak, 0);
    EXPECT_OK(pg.CheckIssueOrder());
  });
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, QuantizedGather,
    ::testing::Values(Case{1, GatherDType::kInt8, 64}, Case{2, GatherDType::kInt8, 64},
                      Case{2, GatherDType::kInt8, 4096}, Case{4, GatherDType::kInt8, 100},
                      Case{2, GatherDType::kFp8E4M3, 64}, Case{4, GatherDType::kFp8E4M3, 4096},
                      Case{2, GatherDType::kBF16, 4096}, Case{4, GatherDType::kBF16, 4096},
                      Case{2, GatherDType::kF16, 4096}, Case{4, GatherDType::kF16, 4096}));

// The cast gathers' codec: 2 bytes an element, no scales; what a param_dtype cast gives
// (nearest, ties to even; inf, -0 and subnormals kept; NaN stays NaN).
TEST(GatherQuantCodec, CastGathersRoundToNearestAndKeepSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.0f,         -0.0f,    1.0f,     1.00390625f, 1.005859375f,
                                -3.14159265f, 65504.0f, 65520.0f, 1e-7f,       6e-8f,
                                1e-40f,       3.0e38f,  inf,      -inf};
  for (GatherDType t : {GatherDType::kBF16, GatherDType::kF16}) {
    const GatherQuant q{t, 4096};
    ASSERT_TRUE(IsCastGather(t));
    ASSERT_EQ(QuantRecordBytes(q, x.size()), 2 * x.size());
    std::vector<uint8_t> rec(QuantRecordBytes(q, x.size()));
    std::vector<float> out(x.size());
    QuantizeBlocks(q, x.data(), x.size(), rec.data());
    DequantizeBlocks(q, rec.data(), x.size(), out.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = t == GatherDType::kBF16 ? (std::isinf(x[i]) ? x[i] : NearestBf16(x[i]))
                                                 : static_cast<float>(static_cast<_Float16>(x[i]));
      EXPECT_EQ(Bits(out[i]), Bits(want)) << GatherDTypeName(t) << " of " << x[i];
    }
    const float nan = std::numeric_limits<float>::quiet_NaN();
    QuantizeBlocks(q, &nan, 1, rec.data());
    DequantizeBlocks(q, rec.data(), 1, out.data());
    EXPECT_TRUE(std::isnan(out[0])) << GatherDTypeName(t);
  }
}

// Units: a step's gathers are quantized; GatherAll (summoned parameters, checkpoints) is exact.
TEST(QuantizedGatherUnits, StepGathersQuantizeGatherAllIsExact) {
  RunRanks(2, [&](Group& g) {
    const int me = g.rank();
    std::vector<ParamSpec> ps = F32Params();
    for (size_t i = 0; i < ps.size(); ++i) ps[i].unit = static_cast<int>(i % 3);
    GathererConfig gc;
    gc.timeout = absl::Seconds(60);
    gc.fully_sharded = true;
    gc.quant = {GatherDType::kInt8, 128};
    auto pg = ParamGatherer::Create(MakePlan(ps, 2), &g, gc);
    ASSERT_TRUE(pg.ok()) << pg.status();
    const BucketPlan& plan = (*pg)->plan();
    auto units = UnitScheduler::Create(pg->get(), UnitConfig{});
    ASSERT_TRUE(units.ok()) << units.status();
    for (int b = 0; b < (*pg)->num_buckets(); ++b) {
      float* p = static_cast<float*>((*pg)->ShardView(b)->data);
      for (size_t j = 0; j < plan.buckets()[b].shard_count; ++j) p[j] = ShardValue(me, b, j, 0);
    }
    // Bucket b's parameter p against either the exact shards or the reference quantization.
    auto check = [&](int b, bool exact) {
      const Bucket& bk = plan.buckets()[b];
      std::vector<float> want;
      for (int r = 0; r < 2; ++r) {
        std::vector<float> s = ReferenceShard(gc.quant, r, b, bk.shard_count, 0);
        for (size_t j = 0; j < bk.shard_count; ++j) {
          want.push_back(exact ? ShardValue(r, b, j, 0) : s[j]);
        }
      }
      for (int p : bk.params) {
        auto v = (*pg)->ParamView(plan.params()[p].id);
        ASSERT_TRUE(v.ok()) << v.status();
        const float* got = static_cast<const float*>(v->data);
        for (size_t j = 0; j < v->count; ++j) {
          ASSERT_EQ(Bits(got[j]), Bits(want[plan.slot(p).offset + j]))
              << (exact ? "GatherAll" : "forward") << ", bucket " << b << " element " << j;
        }
      }
    };
    for (int u = 0; u < 3; ++u) {
      ASSERT_OK((*units)->BeginForward(u));
      for (int b : plan.UnitBuckets(u)) check(b, /*exact=*/false);
      ASSERT_OK((*units)->EndForward(u));
    }
    ASSERT_OK((*units)->EndStep());
    ASSERT_OK((*units)->GatherAll());
    for (int b = 0; b < (*pg)->num_buckets(); ++b) check(b, /*exact=*/true);
    ASSERT_OK((*units)->ReleaseAll());
  });
}

TEST(QuantizedGatherErrors, BadSettingsAreNamed) {
  RunRanks(2, [&](Group& g) {
    GathererConfig gc;
    gc.timeout = absl::Seconds(30);
    gc.quant = {GatherDType::kInt8, 4096};
    ExpectError(ParamGatherer::Create(MakePlan(F32Params(), 2), &g, gc).status(),
                absl::StatusCode::kInvalidArgument, {"int8", "fully_sharded"});
    gc.fully_sharded = true;
    gc.quant.block = 0;
    ExpectError(ParamGatherer::Create(MakePlan(F32Params(), 2), &g, gc).status(),
                absl::StatusCode::kInvalidArgument, {"block is 0"});
    gc.quant.block = 64;
    std::vector<ParamSpec> ps = F32Params();
    ps[3].dtype = DType::kBF16;
    ExpectError(ParamGatherer::Create(MakePlan(ps, 2), &g, gc).status(),
                absl::StatusCode::kInvalidArgument, {"layer3.weight", "bf16", "only f32"});
  });
}

}  // namespace
}  // namespace braid::sched
