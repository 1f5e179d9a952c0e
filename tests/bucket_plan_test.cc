// BucketPlan rules, and the cross-rank plan check on the local backend.
#include "scheduler/bucket_plan.h"

#include <numeric>

#include "gtest/gtest.h"
#include "scheduler/plan_check.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::RunRanks;

std::vector<ParamSpec> Params(std::vector<std::pair<size_t, DType>> specs) {
  std::vector<ParamSpec> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    out.push_back(ParamSpec{static_cast<ParamId>(100 + i), specs[i].first, specs[i].second,
                            Device::Cpu(), "p" + std::to_string(i)});
  }
  return out;
}

TEST(BucketPlan, UnitsNeverShareABucket) {
  PlanOptions o;
  o.first_bucket_cap_bytes = 1 << 20;
  o.bucket_cap_bytes = 1 << 20;
  o.align_bytes = 4;
  o.shards = 2;
  auto params = Params({{10, DType::kF32},
                        {20, DType::kF32},
                        {30, DType::kF32},
                        {40, DType::kF32},
                        {50, DType::kBF16}});
  const int units[] = {0, 0, 1, 1, 1};
  for (int i = 0; i < 5; ++i) params[i].unit = units[i];
  auto plan = BucketPlan::Build(params, o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Reverse order: p4 (bf16, unit 1), p3 + p2 (f32, unit 1), p1 + p0 (f32, unit 0): without
  // units p1 and p0 would join p3 and p2's bucket.
  ASSERT_EQ(plan->buckets().size(), 3u);
  EXPECT_EQ(plan->buckets()[0].params, (std::vector<int>{4}));
  EXPECT_EQ(plan->buckets()[1].params, (std::vector<int>{3, 2}));
  EXPECT_EQ(plan->buckets()[2].params, (std::vector<int>{1, 0}));
  EXPECT_EQ(plan->buckets()[2].unit, 0);
  EXPECT_EQ(plan->num_units(), 2);
  EXPECT_EQ(plan->UnitBuckets(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(plan->UnitBuckets(0), (std::vector<int>{2}));
  EXPECT_TRUE(plan->UnitBuckets(7).empty());
  // Unit 0 leaves the fingerprint as it was before units existed; another unit changes it.
  auto flat = params;
  for (auto& p : flat) p.unit = 0;
  auto plan0 = BucketPlan::Build(flat, o);
  ASSERT_TRUE(plan0.ok());
  EXPECT_NE(BucketPlan::ParamHash(params[2]), BucketPlan::ParamHash(flat[2]));
  EXPECT_EQ(BucketPlan::ParamHash(params[0]), BucketPlan::ParamHash(flat[0]));
  params[0].unit = -1;
  auto bad = BucketPlan::Build(params, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'p0' (id 100): unit must be >= 0"), std::string::npos)
      << bad.status();
}

TEST(BucketPlan, ReverseOrderCapsAndFirstBucket) {
  PlanOptions o;
  o.first_bucket_cap_bytes = 1024;  // 256 f32
  o.bucket_cap_bytes = 4096;        // 1024 f32
  o.align_bytes = 4;
  auto plan = BucketPlan::Build(Params({{100, DType::kF32},
                                        {200, DType::kF32},
                                        {900, DType::kF32},
                                        {150, DType::kF32},
                                        {100, DType::kF32}}),
                                o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Reverse registration order: p4 (100) + p3 (150) fit the 256-element first bucket; p2 (900)
  // does not, so it opens bucket 1; p1 (200) no longer fits there (1100 > 1024) -> bucket 2.
  ASSERT_EQ(plan->buckets().size(), 3u);
  EXPECT_EQ(plan->buckets()[0].params, (std::vector<int>{4, 3}));
  EXPECT_EQ(plan->buckets()[1].params, (std::vector<int>{2}));
  EXPECT_EQ(plan->buckets()[2].params, (std::vector<int>{1, 0}));
  EXPECT_EQ(plan->slot(3).offset, 100u);
  EXPECT_EQ(plan->slot(0).bucket, 2);
  EXPECT_EQ(plan->slot(0).offset, 200u);
}

TEST(BucketPlan, OneDTypePerBucketAndOversizedParamAlone) {
  PlanOptions o;
  o.first_bucket_cap_bytes = 64;
  o.bucket_cap_bytes = 64;
  auto plan = BucketPlan::Build(
      Params({{4, DType::kF32}, {4, DType::kBF16}, {4, DType::kF32}, {1000, DType::kBF16}}), o);
  ASSERT_TRUE(plan.ok());
  for (const Bucket& b : plan->buckets()) {
    for (int i : b.params) EXPECT_EQ(plan->params()[i].dtype, b.dtype);
  }
  // The 1000-element bf16 parameter exceeds every cap: a bucket of its own.
  const Bucket& big = plan->buckets()[plan->slot(3).bucket];
  EXPECT_EQ(big.params, (std::vector<int>{3}));
}

TEST(BucketPlan, ShardsAreEqualAlignedAndParamsMayStraddle) {
  PlanOptions o;
  o.shards = 3;
  o.align_bytes = 64;
  auto plan =
      BucketPlan::Build(Params({{37, DType::kF32}, {101, DType::kBF16}, {50, DType::kF32}}), o);
  ASSERT_TRUE(plan.ok());
  for (const Bucket& b : plan->buckets()) {
    const size_t align = 64 / DTypeSize(b.dtype);
    EXPECT_EQ(b.padded_count % (3 * align), 0u);
    EXPECT_EQ(b.shard_count * 3, b.padded_count);
    EXPECT_GE(b.padded_count, b.count);
    for (int i : b.params) EXPECT_EQ(plan->slot(i).offset % align, 0u);  // aligned offsets
  }
  // f32 bucket: p2 (50) at 0, p0 (37) at 64 -> count 101, padded to 3*16 multiple = 144.
  const Bucket& f = plan->buckets()[plan->slot(0).bucket];
  EXPECT_EQ(f.count, 101u);
  EXPECT_EQ(f.padded_count, 144u);
  EXPECT_EQ(f.shard_count, 48u);  // p0 spans shards 1 and 2
}

TEST(BucketPlan, BadInputNamesTheParameter) {
  auto dup = Params({{4, DType::kF32}, {4, DType::kF32}});
  dup[1].id = dup[0].id;
  auto s = BucketPlan::Build(dup, PlanOptions{}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'p1' (id 100) is registered twice"), absl::string_view::npos) << s;
  auto bad = Params({{4, static_cast<DType>(42)}});
  s = BucketPlan::Build(bad, PlanOptions{}).status();
  EXPECT_NE(s.message().find("'p0'"), absl::string_view::npos) << s;
  PlanOptions o;
  o.align_bytes = 48;
  EXPECT_EQ(BucketPlan::Build(Params({{4, DType::kF32}}), o).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto plan = BucketPlan::Build(Params({{4, DType::kF32}}), PlanOptions{});
  EXPECT_EQ(plan->IndexOf(7).status().code(), absl::StatusCode::kNotFound);
}

// Bytes that wrap size_t (count x element size) or pass kMaxPlanBytes together are refused,
// naming the parameter that crosses the limit, before any offset is computed.
TEST(BucketPlan, BytesPastTheLimitNameTheParameter) {
  auto wrap = Params({{4, DType::kF32}, {(SIZE_MAX / 4) + 1, DType::kF32}});
  auto s = BucketPlan::Build(wrap, PlanOptions{}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("parameter 'p1' (id 101): 4611686018427387904 elements of 4 bytes"),
            absl::string_view::npos)
      << s;
  auto sum = Params({{size_t{1} << 58, DType::kF16},
                     {size_t{1} << 58, DType::kF16},
                     {1, DType::kF16}});  // exactly 2^60 bytes, then one element more
  s = BucketPlan::Build(sum, PlanOptions{}).status();
  EXPECT_NE(s.message().find("parameter 'p2' (id 102): 1 elements of 2 bytes"),
            absl::string_view::npos)
      << s;
}

TEST(BucketPlan, ExplicitOrderAndFingerprint) {
  auto params = Params({{10, DType::kF32}, {20, DType::kF32}, {30, DType::kF32}});
  auto a = BucketPlan::BuildInOrder(params, {1, 0, 2}, PlanOptions{});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->buckets()[0].params, (std::vector<int>{1, 0, 2}));
  auto b = BucketPlan::Build(params, PlanOptions{});
  EXPECT_NE(a->Fingerprint(), b->Fingerprint());
  EXPECT_EQ(b->Fingerprint(), BucketPlan::Build(params, PlanOptions{})->Fingerprint());
  EXPECT_FALSE(BucketPlan::BuildInOrder(params, {1, 1, 2}, PlanOptions{}).ok());
}

// FingerprintOn: the layout's hash as if on another device (what the optimizer's state files
// record): a CPU plan's own fingerprint, and the same for that plan's CUDA twin, whose own
// Fingerprint (device included) differs; a different layout still differs.
TEST(BucketPlan, FingerprintOnIgnoresTheDeviceOnly) {
  auto params = Params({{10, DType::kF32}, {20, DType::kBF16}, {30, DType::kF32}});
  auto cpu = BucketPlan::Build(params, PlanOptions{});
  for (auto& p : params) p.device = Device::Cuda(1);
  auto cuda = BucketPlan::Build(params, PlanOptions{});
  ASSERT_TRUE(cpu.ok() && cuda.ok());
  EXPECT_EQ(cpu->FingerprintOn(Device::Cpu()), cpu->Fingerprint());
  EXPECT_NE(cuda->Fingerprint(), cpu->Fingerprint());
  EXPECT_EQ(cuda->FingerprintOn(Device::Cpu()), cpu->Fingerprint());
  EXPECT_EQ(cpu->FingerprintOn(Device::Cuda(1)), cuda->Fingerprint());
  params[1].count = 21;
  EXPECT_NE(BucketPlan::Build(params, PlanOptions{})->FingerprintOn(Device::Cpu()),
            cpu->Fingerprint());
}

TEST(PlanCheck, IdenticalPlansPassAndADifferentParameterIsNamedOnEveryRank) {
  RunRanks(3, [](Group& g) {
    auto params = Params({{10, DType::kF32}, {20, DType::kBF16}, {30, DType::kF32}});
    auto same = BucketPlan::Build(params, PlanOptions{});
    EXPECT_OK(VerifyPlanAcrossRanks(*same, g, absl::Seconds(30)));
    if (g.rank() == 2) params[1].count = 21;
    auto differ = BucketPlan::Build(params, PlanOptions{});
    absl::Status s = VerifyPlanAcrossRanks(*differ, g, absl::Seconds(30));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("parameter #1"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("'p1'"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("21 x bf16"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("rank 2"), absl::string_view::npos) << s;
    auto fewer = params;
    if (g.rank() == 1) fewer.pop_back();
    s = VerifyPlanAcrossRanks(*BucketPlan::Build(fewer, PlanOptions{}), g, absl::Seconds(30));
    EXPECT_NE(s.message().find("rank 1 registered 2"), absl::string_view::npos) << s;
  });
}

}  // namespace
}  // namespace braid::sched
