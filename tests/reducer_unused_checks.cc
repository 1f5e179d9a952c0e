#include "tests/reducer_unused_checks.h"

#include "gtest/gtest.h"
#include "tests/multirank.h"

namespace braid::sched::testing {

using braid::testing::ExpectError;

std::vector<ParamSpec> TwoParams() {
  return {ParamSpec{1, 8, DType::kF32, Device::Cpu(), "fc.weight"},
          ParamSpec{2, 3, DType::kF32, Device::Cpu(), "fc.bias"}};
}

void CheckUnusedReportedByName(Group& g, ReducerConfig cfg) {
  auto red = GradientReducer::Create(TwoParams(), {&g, nullptr}, cfg);
  ASSERT_TRUE(red.ok()) << red.status();
  ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
  ASSERT_OK((*red)->MarkReady(2));  // the bias bucket (bucket 0: reverse order) launches
  ExpectError((*red)->FinishBackward(), absl::StatusCode::kFailedPrecondition,
              {"1 parameter(s)", "'fc.weight' (id 1)", "allow_unused"});
}

void CheckUnusedZeroFilledButNoSyncSumsKept(Group& g, ReducerConfig cfg) {
  const int n = g.size();
  cfg.allow_unused = true;
  auto red = GradientReducer::Create(TwoParams(), {&g, nullptr}, cfg);
  ASSERT_TRUE(red.ok()) << red.status();
  GradientReducer& r = **red;
  float* wd = static_cast<float*>(r.GradView(1)->data);
  float* bd = static_cast<float*>(r.GradView(2)->data);
  // Microbatch 1 (no_sync): both used. Microbatch 2 (sync): rank 0 uses only the bias, and its
  // weight holds the no_sync sum, which must be reduced, not zero-filled; the others use both.
  ASSERT_OK(r.BeginBackward(SyncMode::kNoSync));
  for (int i = 0; i < 8; ++i) wd[i] += 1.0f + g.rank();
  for (int i = 0; i < 3; ++i) bd[i] += 10.0f;
  ASSERT_OK(r.MarkReady(1));
  ASSERT_OK(r.MarkReady(2));
  ASSERT_OK(r.FinishBackward());
  ASSERT_OK(r.BeginBackward(SyncMode::kSync));
  for (int i = 0; i < 3; ++i) bd[i] += 2.0f;
  ASSERT_OK(r.MarkReady(2));
  if (g.rank() != 0) {
    for (int i = 0; i < 8; ++i) wd[i] += 4.0f;
    ASSERT_OK(r.MarkReady(1));
  }
  ASSERT_OK(r.FinishBackward());
  // (sum over ranks of 1 + rank, plus 4 from each rank but 0) / n: exact, n is a power of two.
  const float want_w = static_cast<float>(n * (n + 1) / 2 + 4 * (n - 1)) / static_cast<float>(n);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(wd[i], want_w) << i;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bd[i], 12.0f) << i;

  // Next window: a parameter unused since the last sync is zero-filled on every rank.
  ASSERT_OK(r.ZeroGrads());
  ASSERT_OK(r.BeginBackward(SyncMode::kSync));
  for (int i = 0; i < 8; ++i) wd[i] = 123.0f;  // written but never marked: stale, dropped
  for (int i = 0; i < 3; ++i) bd[i] += 1.0f;
  ASSERT_OK(r.MarkReady(2));
  ASSERT_OK(r.FinishBackward());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(wd[i], 0.0f) << i;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(bd[i], 1.0f) << i;
}

}  // namespace braid::sched::testing
