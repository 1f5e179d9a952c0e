// ShardedOptimizer over the `mpi` backend under mpirun (2 and 4 processes), bit for bit against
// the serial reference of tests/optim/optimizer_harness.h (exact gradients: MPI picks its own
// reduction order). This also runs the ParamGatherer's all-gathers under mpirun.
//
// Every process runs the same tests in the same order (the rank-order contract applies to the
// test itself); deadlines of 60 s and run_mpi.sh's limit turn a divergence into failures.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/mpi_world.h"
#include "tests/multirank.h"
#include "tests/optim/optimizer_harness.h"

namespace braid::optim::testing {
namespace {

Group* the_world = nullptr;

using Case = NamedScenario;

OptScenario Base(int replicas, int shards) { return TwoGroupScenario(replicas, shards); }

std::vector<Case> CasesForWorld() {
  const int n = the_world != nullptr ? the_world->size() : 2;
  std::vector<Case> c;
  c.push_back({"adamw_f32", Base(1, n)});
  {
    Case k{"adamw_bf16_nosync", Base(1, n)};
    k.s.dtype = DType::kBF16;
    k.s.schedule = {SyncMode::kNoSync, SyncMode::kSync};
    c.push_back(k);
  }
  {
    Case k{"sgd_f32_clip", Base(1, n)};
    k.s.opt.kind = OptimizerKind::kSgd;
    k.s.opt.max_grad_norm = 0.5;
    c.push_back(k);
  }
  {
    Case k{"adamw_f16_skip_inf_explicit", Base(1, n)};
    k.s.dtype = DType::kF16;
    k.s.opt.skip_nonfinite = true;
    k.s.opt.overlap = false;
    k.s.inf_step = 1;
    c.push_back(k);
  }
  if (n == 4) {
    Case k{"adamw_f32_mesh2x2_rsonly_clip_skip", Base(2, 2)};
    k.s.schedule = {SyncMode::kReduceScatterOnly, SyncMode::kSync};
    k.s.opt.max_grad_norm = 0.5;
    k.s.opt.skip_nonfinite = true;
    k.s.inf_step = 2;
    c.push_back(k);
  }
  return c;
}

class MpiOptimizer : public ::testing::TestWithParam<Case> {};

TEST_P(MpiOptimizer, BitExactAgainstReference) {
  EXPECT_OK(CheckAgainstReference(*the_world, GetParam().s));
}

INSTANTIATE_TEST_SUITE_P(World, MpiOptimizer, ::testing::ValuesIn(CasesForWorld()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(MpiOptimizer, ResumeFromCheckpointIsBitExact) {
  OptScenario s = Base(1, the_world->size());
  s.dtype = DType::kBF16;
  s.steps = 4;
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/mpi_resume_rank", the_world->rank(), ".braid");
  std::vector<std::vector<uint8_t>> uninterrupted;
  {
    auto st = BuildStack(*the_world, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK(RunSteps(**st, s, 0, 2));
    ASSERT_OK((*st)->opt->Save(path));
    ASSERT_OK(RunSteps(**st, s, 2, 4));
    uninterrupted = Params(**st, s).value();
  }
  auto st = BuildStack(*the_world, s);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_OK((*st)->opt->Load(path));
  ASSERT_OK(RunSteps(**st, s, 2, 4));
  EXPECT_EQ(Params(**st, s).value(), uninterrupted);
  EXPECT_EQ(uninterrupted, ReferenceParams(s, 4));
}

}  // namespace
}  // namespace braid::optim::testing

int main(int argc, char** argv) {
  return braid::testing::RunTestsOnMpiWorld(argc, argv, absl::Seconds(60),
                                            &braid::optim::testing::the_world);
}
