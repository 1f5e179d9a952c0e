// The GradientReducer end to end on a real GPU: a single-rank `nccl` world (NCCL allows one
// rank per device), bucket storage in device memory, gradients copied in on a compute stream
// and marked ready with events recorded there, every bucket operation on the comm streams,
// results read back and compared bit for bit with the serial reference. All-reduce,
// reduce-scatter and hybrid (1 x 1 mesh), f32 and bf16 reduced in f32, no_sync, copy-in.
// Multi-rank arithmetic is covered on the fake device (nccl_reducer_test); this checks the
// real runtime, the real cast kernel and real stream semantics. Skips without a GPU (CUDA
// error 35 or 100).
//
//   tools/bazelw test //tests/nccl:nccl_reducer_gpu_test --test_output=all
#include <cuda_runtime.h>

#include <memory>

#include <string>

#include "gtest/gtest.h"
#include "tests/nccl/device_reducer_driver.h"
#include "tests/nccl/real_gpu_world.h"

namespace braid::nccl::testing {
namespace {

using sched::ReduceMode;
using sched::reference::Scenario;
using sched::reference::ScenarioName;

class NcclReducerGpuTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(NcclReducerGpuTest, MatchesSerialReference) {
  std::string no_gpu;
  const absl::Status gpu = NoGpuReason(&no_gpu);
  ASSERT_TRUE(gpu.ok()) << gpu;
  if (!no_gpu.empty()) GTEST_SKIP() << no_gpu;
  auto w = MakeRealSingleRankWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  const absl::Status s = RunDeviceScenario(*w->world, w->apis.cuda, GetParam(), ExactGrad, absl::Seconds(60));
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(
    Modes, NcclReducerGpuTest,
    ::testing::Values(Scenario{ReduceMode::kAllReduce, 1, 1, 0, "NS"},
                      Scenario{ReduceMode::kAllReduce, 1, 1, 1, "NS", false, true},
                      Scenario{ReduceMode::kAllReduce, 1, 1, 0, "NS", true},
                      Scenario{ReduceMode::kReduceScatter, 1, 1, 0, "NS"},
                      Scenario{ReduceMode::kReduceScatter, 1, 1, 1, "NS", false, true},
                      Scenario{ReduceMode::kHybrid, 1, 1, 0, "NS"},
                      Scenario{ReduceMode::kHybrid, 1, 1, 1, "NNS", false, true}),
    [](const ::testing::TestParamInfo<Scenario>& i) { return ScenarioName(i.param); });

}  // namespace
}  // namespace braid::nccl::testing
