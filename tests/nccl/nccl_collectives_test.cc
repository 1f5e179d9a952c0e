// Every collective x reduce op x dtype x rank count x in-place/out-of-place through the nccl
// backend on the fake CUDA/NCCL (host memory, fake ranks as threads), at sizes 0, 1, odd and
// large, compared bit for bit with the serial reference of tests/collective_check.h in its
// NCCL-arithmetic form (CollectiveCase::nccl_arithmetic: ncclAvg's pre-multiplied 1/n, scalars
// and bf16/f16 sums rounded in the data type, as NCCL 2.28.9 computes them and the fake
// does). This checks the backend's plumbing (types, ops, pre-mul-sum scalars, in-place
// offsets, streams, events, futures), in blocking and nonblocking modes.
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/collective_check.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"
#include "tests/nccl/fake_nccl_reduce.h"

namespace braid::nccl::testing {
namespace {

using braid::testing::CollectiveCase;
using braid::testing::CollectiveVariant;
using braid::testing::kCheckSizes;
using braid::testing::kCollectiveVariants;

absl::Status CheckAllSizesOnNccl(Group& g, const CollectiveVariant& k, DType dtype, bool in_place) {
  uint64_t seed = 1;
  for (size_t count : kCheckSizes) {
    CollectiveCase c{k.kind, k.op, dtype, count, in_place, false, seed++, g.size() - 1};
    c.nccl_arithmetic = true;
    absl::Status s = braid::testing::RunAndCheck(g, c);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(CaseName(c), ": ", s.message()));
  }
  return absl::OkStatus();
}

using Param = std::tuple<int /*kind index*/, DType, int /*ranks*/, bool /*in_place*/>;

class NcclCollectives : public ::testing::TestWithParam<Param> {};

TEST_P(NcclCollectives, MatchesSerialReference) {
  const auto [ki, dtype, ranks, in_place] = GetParam();
  const CollectiveVariant k = kCollectiveVariants[ki];
  if (const char* why = braid::testing::MatrixSkipReason(k, dtype, in_place)) GTEST_SKIP() << why;
  FakeGpu gpu;
  RunFakeRanks(gpu, ranks, FakeConfig(), [&](NcclGroup& g) {
    if (braid::testing::RefusedUpFront(k, dtype)) {
      const absl::Status s = braid::testing::LaunchStatus(g, k.kind, dtype, k.op);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find(DTypeName(dtype)), absl::string_view::npos) << s;
      return;
    }
    EXPECT_OK(CheckAllSizesOnNccl(g, k, dtype, in_place));
  });
  ExpectClean(gpu);
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [ki, dtype, ranks, in_place] = info.param;
  return braid::testing::MatrixCaseName(kCollectiveVariants[ki], dtype, ranks, in_place);
}

INSTANTIATE_TEST_SUITE_P(
    All, NcclCollectives,
    ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCollectiveVariants))),
                       ::testing::ValuesIn(kAllDTypes), ::testing::Values(1, 2, 3, 4),
                       ::testing::Bool()),
    ParamName);

// The same matrix (fewer dtypes) on nonblocking communicators: every call goes through the
// ncclInProgress state machine, and the fake flags any call made while in progress.
class NcclNonblockingCollectives : public ::testing::TestWithParam<Param> {};

TEST_P(NcclNonblockingCollectives, MatchesSerialReference) {
  const auto [ki, dtype, ranks, in_place] = GetParam();
  const CollectiveVariant k = kCollectiveVariants[ki];
  if (const char* why = braid::testing::MatrixSkipReason(k, dtype, in_place)) GTEST_SKIP() << why;
  FakeGpu gpu;
  gpu.nccl->SetInProgressPolls(3);
  RunFakeRanks(gpu, ranks, FakeConfig(/*blocking=*/false),
               [&](NcclGroup& g) { EXPECT_OK(CheckAllSizesOnNccl(g, k, dtype, in_place)); });
  ExpectClean(gpu);
  EXPECT_EQ(gpu.nccl->comms_finalized(), ranks);
}

INSTANTIATE_TEST_SUITE_P(
    All, NcclNonblockingCollectives,
    ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCollectiveVariants))),
                       ::testing::Values(DType::kF32, DType::kBF16), ::testing::Values(1, 3),
                       ::testing::Bool()),
    ParamName);

// The fake's ncclAvg scalar is NCCL's: the double 1.0/n converted through float to the dtype.
TEST(FakeNcclArithmetic, AvgScalarIsNcclsRoundedReciprocal) {
  EXPECT_EQ(NcclAvgScalar(DType::kF64, 3), 1.0 / 3);
  EXPECT_EQ(NcclAvgScalar(DType::kF32, 3), static_cast<double>(static_cast<float>(1.0 / 3)));
  EXPECT_EQ(NcclAvgScalar(DType::kBF16, 3), 0.333984375);    // bf16 0x3eab
  EXPECT_EQ(NcclAvgScalar(DType::kF16, 3), 0.333251953125);  // f16 0x3555
  EXPECT_EQ(NcclAvgScalar(DType::kBF16, 6), 0.1669921875);
  EXPECT_EQ(NcclAvgScalar(DType::kF16, 8), 0.125);
}

// Avg over 3 ranks in f32 differs from sum-then-divide where NCCL's rounding does: the fake
// gives NCCL's bits (each input times float(1/3), summed in rank order).
TEST(FakeNcclArithmetic, AvgIsAPremultipliedSumNotSumThenDivide) {
  const float s = static_cast<float>(1.0 / 3);
  std::vector<float> x = {0.1f, 0.7f, 1.3f, 2.9f, -3.3f, 5.5f, 1e-3f, 7.77f};
  size_t differs = 0;
  for (size_t i = 0; i + 2 < x.size(); ++i) {
    const float a = x[i], b = x[i + 1], c = x[i + 2];
    std::vector<float> in0 = {a}, in1 = {b}, in2 = {c}, out = {0};
    const void* in[] = {in0.data(), in1.data(), in2.data()};
    void* outs[] = {out.data()};
    FakeNcclReduce(in, 3, outs, 1, 1, DType::kF32, FakeRedOp::kAvg, nullptr);
    const float premul = (a * s + b * s) + c * s;
    EXPECT_EQ(out[0], premul) << a << " " << b << " " << c;
    differs += out[0] != ((a + b) + c) / 3.0f;
  }
  EXPECT_GT(differs, 0u);  // the inputs do tell the two apart
}

}  // namespace
}  // namespace braid::nccl::testing
