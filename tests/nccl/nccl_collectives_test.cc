// Every collective x reduce op x dtype x rank count x in-place/out-of-place through the nccl
// backend on the fake CUDA/NCCL (host memory, fake ranks as threads), at sizes 0, 1, odd and
// large, compared bit for bit with the serial reference of tests/collective_check.h. This
// checks the backend's plumbing (types, ops, pre-mul-sum scalars, in-place offsets, streams,
// events, futures), in blocking and nonblocking modes, not NCCL's arithmetic. premul_sum on
// bf16/f16 uses exact data: NCCL takes the scalar in the data type, so 1/(3+rank) is rounded
// to bf16/f16 first (nccl_types.h), unlike the reference.
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/collective_check.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl::testing {
namespace {

using braid::testing::CollectiveCase;
using braid::testing::CollectiveVariant;
using braid::testing::kCheckSizes;
using braid::testing::kCollectiveVariants;

absl::Status CheckAllSizesOnNccl(Group& g, const CollectiveVariant& k, DType dtype,
                                 bool in_place) {
  uint64_t seed = 1;
  const bool exact = k.op == ReduceKind::kPreMulSum && IsHalf(dtype);
  for (size_t count : kCheckSizes) {
    CollectiveCase c{k.kind, k.op, dtype, count, in_place, exact, seed++, g.size() - 1};
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
  RunFakeRanks(gpu, ranks, FakeConfig(/*blocking=*/false), [&](NcclGroup& g) {
    EXPECT_OK(CheckAllSizesOnNccl(g, k, dtype, in_place));
  });
  ExpectClean(gpu);
  EXPECT_EQ(gpu.nccl->comms_finalized(), ranks);
}

INSTANTIATE_TEST_SUITE_P(
    All, NcclNonblockingCollectives,
    ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCollectiveVariants))),
                       ::testing::Values(DType::kF32, DType::kBF16), ::testing::Values(1, 3),
                       ::testing::Bool()),
    ParamName);

}  // namespace
}  // namespace braid::nccl::testing
