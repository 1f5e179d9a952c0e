// Every collective x reduce op x dtype x rank count x in-place/out-of-place on the `local`
// backend, each at sizes 0, 1, odd and large, compared bit for bit with the serial reference
// (local reduces in fixed rank order, so even bf16/f16 must match exactly).
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/collective_check.h"
#include "tests/multirank.h"

namespace braid::testing {
namespace {

using Param = std::tuple<int /*kind index*/, DType, int /*ranks*/, bool /*in_place*/>;

class LocalCollectives : public ::testing::TestWithParam<Param> {};

TEST_P(LocalCollectives, MatchesSerialReference) {
  const auto [ki, dtype, ranks, in_place] = GetParam();
  const CollectiveVariant k = kCollectiveVariants[ki];
  if (const char* why = MatrixSkipReason(k, dtype, in_place)) GTEST_SKIP() << why;
  if (RefusedUpFront(k, dtype)) {
    // Rejected up front with an error naming op and dtype (checked in errors_test too).
    RunRanks(ranks, [&](Group& g) {
      const absl::Status s = LaunchStatus(g, k.kind, dtype, k.op);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find(CollectiveName(k.kind)), absl::string_view::npos) << s;
      EXPECT_NE(s.message().find(DTypeName(dtype)), absl::string_view::npos) << s;
    });
    return;
  }
  RunRanks(ranks, [&](Group& g) { EXPECT_OK(CheckAllSizes(g, k, dtype, in_place)); });
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [ki, dtype, ranks, in_place] = info.param;
  return MatrixCaseName(kCollectiveVariants[ki], dtype, ranks, in_place);
}

INSTANTIATE_TEST_SUITE_P(
    All, LocalCollectives,
    ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCollectiveVariants))),
                       ::testing::ValuesIn(kAllDTypes), ::testing::Values(1, 2, 3, 4, 8),
                       ::testing::Bool()),
    ParamName);

// The same collective repeated with different thread timings gives the same bits.
TEST(LocalDeterminism, RepeatedRunsAreBitIdentical) {
  for (int trial = 0; trial < 5; ++trial) {
    RunRanks(4, [&](Group& g) {
      CollectiveCase c{
          CollectiveKind::kAllReduce, ReduceKind::kSum, DType::kF32, 4099, false, false, 77, 0};
      if (g.rank() == trial % 4) absl::SleepFor(absl::Milliseconds(2));  // perturb arrival order
      EXPECT_OK(RunAndCheck(g, c));
    });
  }
}

// Many collectives in flight at once on one group complete in issue order, all correct.
TEST(LocalAsync, ManyInFlightThenWaitAll) {
  RunRanks(3, [](Group& g) {
    constexpr int kOps = 50;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(33));
    std::vector<WorkPtr> works;
    for (int i = 0; i < kOps; ++i) {
      for (size_t j = 0; j < bufs[i].size(); ++j) bufs[i][j] = static_cast<float>(i + g.rank() + j);
      auto w =
          g.AllReduce(bufs[i].data(), bufs[i].data(), bufs[i].size(), DType::kF32, ReduceOp::Sum());
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      works.push_back(*w);
    }
    for (int i = 0; i < kOps; ++i) {
      ASSERT_OK(works[i]->Wait(absl::Seconds(30)));
      EXPECT_EQ(works[i]->info().seq, static_cast<uint64_t>(i));
      for (size_t j = 0; j < bufs[i].size(); ++j) {
        ASSERT_EQ(bufs[i][j], static_cast<float>(3 * (i + j) + 0 + 1 + 2)) << i << "," << j;
      }
    }
  });
}

}  // namespace
}  // namespace braid::testing

namespace braid::testing {
namespace {

// Back-to-back collectives of different kinds, including one-phase barriers, with no pause:
// a fast rank posting its next call must never be mistaken for the current one.
TEST(LocalOrdering, BackToBackMixedCollectivesNeverCrossTalk) {
  for (int ranks : {2, 3, 5}) {
    RunRanks(ranks, [](Group& g) {
      const int n = g.size();
      for (int i = 0; i < 300; ++i) {
        auto b = g.Barrier();
        ASSERT_TRUE(b.ok()) << b.status();
        int32_t mine = i * 10 + g.rank();
        std::vector<int32_t> all(n);
        auto ag = g.AllGather(&mine, all.data(), 1, DType::kI32);
        ASSERT_TRUE(ag.ok()) << ag.status();
        int64_t v = i, sum = 0;
        auto ar = g.AllReduce(&v, &sum, 1, DType::kI64, ReduceOp::Sum());
        ASSERT_TRUE(ar.ok()) << ar.status();
        ASSERT_OK((*b)->Wait(absl::Seconds(30)));
        ASSERT_OK((*ag)->Wait(absl::Seconds(30)));
        ASSERT_OK((*ar)->Wait(absl::Seconds(30)));
        for (int k = 0; k < n; ++k) ASSERT_EQ(all[k], i * 10 + k);
        ASSERT_EQ(sum, static_cast<int64_t>(i) * n);
      }
    });
  }
}

}  // namespace
}  // namespace braid::testing

namespace braid::testing {
namespace {

// Messages large enough that each rank's chunk takes the non-temporal store path (>= 16 MiB
// per output), in place and out of place, f32 and bf16: still bit-exact.
TEST(LocalLarge, StreamingAllReduceIsBitExact) {
  RunRanks(2, [](Group& g) {
    for (bool in_place : {false, true}) {
      EXPECT_OK(RunAndCheck(g, CollectiveCase{CollectiveKind::kAllReduce, ReduceKind::kAvg,
                                              DType::kF32, (size_t{33} << 20) / 4 + 7, in_place}));
    }
    EXPECT_OK(RunAndCheck(g, CollectiveCase{CollectiveKind::kAllReduce, ReduceKind::kSum,
                                            DType::kBF16, (size_t{33} << 20) / 2 + 3, false}));
    EXPECT_OK(RunAndCheck(g, CollectiveCase{CollectiveKind::kReduceScatter, ReduceKind::kSum,
                                            DType::kF32, (size_t{16} << 20) / 4 + 1, true}));
  });
}

}  // namespace
}  // namespace braid::testing
