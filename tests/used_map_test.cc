// The reducer's used-map agreement (scheduler/used_map.h) on the `local` backend: every rank
// uses a random subset of the parameters in each microbatch and marks them in a random order;
// the agreed map must be the OR over ranks and microbatches of the window, and every gradient
// the serial reference's average (a parameter used on some ranks only reduced with zeros from
// the others), in all three modes, with the agreement at FinishBackward or declared up front
// (agreed first, or at FinishBackward on the marks: then a parameter neither declared nor
// marked, torch's reached-but-no-gradient, is unused too).
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "tests/multirank.h"
#include "tests/used_map_checks.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;
using testing::UsedMapCaseName;

constexpr int kWorld = 4;
constexpr int kParams = 6;

using testing::CheckUsedMapAgainstReference;
using testing::UsedMapCase;
using testing::UsedMapParams;

class UsedMapTest : public ::testing::TestWithParam<UsedMapCase> {};

TEST_P(UsedMapTest, AgreedMapAndGradientsMatchTheSerialReference) {
  RunRanks(kWorld, [&](Group& world) { CheckUsedMapAgainstReference(world, GetParam(), false); });
}

INSTANTIATE_TEST_SUITE_P(
    Modes, UsedMapTest,
    ::testing::Values(UsedMapCase{ReduceMode::kAllReduce, UnusedAgreement::kAtFinish, "S"},
                      UsedMapCase{ReduceMode::kAllReduce, UnusedAgreement::kDeclared, "NS"},
                      UsedMapCase{ReduceMode::kReduceScatter, UnusedAgreement::kAtFinish, "NS"},
                      UsedMapCase{ReduceMode::kReduceScatter, UnusedAgreement::kDeclared, "S"},
                      UsedMapCase{ReduceMode::kHybrid, UnusedAgreement::kAtFinish, "RS"},
                      UsedMapCase{ReduceMode::kHybrid, UnusedAgreement::kDeclared, "RRS"},
                      UsedMapCase{ReduceMode::kReduceScatter, UnusedAgreement::kDeclaredAtFinish,
                                  "NS"},
                      UsedMapCase{ReduceMode::kHybrid, UnusedAgreement::kDeclaredAtFinish, "RS"}),
    [](const ::testing::TestParamInfo<UsedMapCase>& i) { return UsedMapCaseName(i.param); });

TEST(UsedMap, StaticGraphKeepsTheFirstStepsMap) {
  RunRanks(kWorld, [](Group& world) {
    CheckUsedMapAgainstReference(
        world, UsedMapCase{ReduceMode::kReduceScatter, UnusedAgreement::kDeclared, "S"}, true);
  });
}

// torch DDP's first static_graph iteration, as braid.pytorch drives it under ZeRO-2: nothing is
// declared (the graph is not known yet), marks are counted, and a parameter whose hook never
// fired on any rank is unused -- skipped by an optimizer, not stepped with zeros.
TEST(UsedMap, StaticGraphFirstBackwardAgreesOnTheMarks) {
  RunRanks(2, [](Group& world) {
    std::vector<ParamSpec> params = UsedMapParams();
    for (ParamSpec& p : params) p.marks = kCountMarks;
    ReducerConfig cfg;
    cfg.mode = ReduceMode::kReduceScatter;
    cfg.agree_unused = UnusedAgreement::kDeclared;
    cfg.static_graph = true;
    cfg.allow_unused = true;
    auto red = GradientReducer::Create(params, {&world, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    GradientReducer& r = **red;
    for (int step = 0; step < 2; ++step) {
      ASSERT_OK(r.BeginBackward(SyncMode::kSync));
      ASSERT_OK(r.DeclareUnused(step == 0 ? std::vector<ParamId>{} : std::vector<ParamId>{12}));
      for (int p = 0; p < kParams; ++p) {
        // layer2 used by no rank; layer3 by rank 1 only.
        if (p != 2 && (p != 3 || world.rank() == 1)) ASSERT_OK(r.MarkReady(10 + p));
      }
      ASSERT_OK(r.FinishBackward());
      EXPECT_FALSE(*r.Used(12)) << "step " << step;
      EXPECT_TRUE(*r.Used(13)) << "step " << step;
      EXPECT_TRUE(*r.Used(10)) << "step " << step;
    }
  });
}

TEST(UsedMap, DeclarationErrorsNameTheParameter) {
  RunRanks(2, [](Group& world) {
    ReducerConfig cfg;
    cfg.agree_unused = UnusedAgreement::kDeclared;
    auto red = GradientReducer::Create(UsedMapParams(), {&world, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    GradientReducer& r = **red;
    ASSERT_OK(r.BeginBackward(SyncMode::kSync));
    ExpectError(r.MarkReady(11), absl::StatusCode::kFailedPrecondition,
                {"'layer1.weight' (id 11)", "before braid_reducer_declare_unused"});
    ExpectError(r.DeclareUnused({10, 10}), absl::StatusCode::kInvalidArgument,
                {"layer0.weight", "twice"});
    ExpectError(r.DeclareUnused({99}), absl::StatusCode::kNotFound, {"99"});
    ASSERT_OK(r.DeclareUnused({10}));
    ExpectError(r.MarkReady(10), absl::StatusCode::kFailedPrecondition,
                {"'layer0.weight' (id 10)", "declared unused in this backward"});
    for (int p = 1; p < kParams; ++p) ASSERT_OK(r.MarkReady(10 + p));
    ASSERT_OK(r.FinishBackward());
    EXPECT_FALSE(*r.Used(10));
    EXPECT_TRUE(*r.Used(11));

    ReducerConfig plain;  // without agree_unused
    auto other = GradientReducer::Create(UsedMapParams(), {&world, nullptr}, plain);
    ASSERT_TRUE(other.ok()) << other.status();
    ASSERT_OK((*other)->BeginBackward(SyncMode::kSync));
    ExpectError((*other)->DeclareUnused({10}), absl::StatusCode::kFailedPrecondition,
                {"agree_unused"});
    for (int p = 0; p < kParams; ++p) ASSERT_OK((*other)->MarkReady(10 + p));
    ASSERT_OK((*other)->FinishBackward());
    EXPECT_TRUE(*(*other)->Used(10));  // no agreement: every parameter counts as used
  });
}

}  // namespace
}  // namespace braid::sched
