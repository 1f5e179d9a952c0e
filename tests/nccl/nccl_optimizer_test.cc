// ShardedOptimizer on the `nccl` backend's fake device (fake_gpu.h): reducer, gatherer and
// optimizer on device buffers, the step queued on the shard group's comm stream by
// FakeStepKernels (adamw_math.h's rules on the fake stream), the all-gather on the gatherer's
// stream waiting on the step's event. Compared bit for bit after every step with the serial
// unsharded reference of tests/optim (reduce-scatter on 2 and 4 ranks, hybrid 2 x 2; AdamW and
// SGD; f32 and bf16; no_sync windows; overlap on and off).
#include <atomic>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "optim/sharded_optimizer.h"
#include "tests/nccl/device_optimizer_driver.h"
#include "tests/nccl/fake_gpu.h"
#include "tests/nccl/fake_step_kernels.h"

namespace braid::nccl::testing {
namespace {

using optim::OptimizerKind;
using optim::testing::NamedScenario;
using optim::testing::OptScenario;
using optim::testing::SyncMode;
using optim::testing::TwoGroupScenario;

NamedScenario Make(const std::string& name, int replicas, int shards, OptimizerKind kind, DType dtype,
                   std::vector<SyncMode> schedule, bool overlap = true) {
  OptScenario s = TwoGroupScenario(replicas, shards);
  s.opt.kind = kind;
  s.dtype = dtype;
  s.schedule = std::move(schedule);
  s.opt.overlap = overlap;
  s.steps = 3;
  return {name, s};
}

class NcclOptimizerTest : public ::testing::TestWithParam<NamedScenario> {};

TEST_P(NcclOptimizerTest, MatchesSerialReference) {
  const OptScenario& s = GetParam().s;
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  RunFakeRanks(gpu, s.replicas * s.shards, FakeConfig(), [&](NcclGroup& world) {
    const absl::Status st = RunDeviceOptimizer(world, gpu.cuda, kernels, s);
    EXPECT_TRUE(st.ok()) << "rank " << world.rank() << ": " << st;
  });
  ExpectClean(gpu);
  EXPECT_GT(kernels->launches(), 0);  // the steps ran as device kernels
}

const SyncMode kS = SyncMode::kSync, kN = SyncMode::kNoSync;
INSTANTIATE_TEST_SUITE_P(
    Scenarios, NcclOptimizerTest,
    ::testing::Values(Make("AdamW_RS2_f32", 1, 2, OptimizerKind::kAdamW, DType::kF32, {kS}),
                      Make("AdamW_RS4_bf16_NoSync", 1, 4, OptimizerKind::kAdamW, DType::kBF16, {kN, kS}),
                      Make("AdamW_Hybrid2x2_f32_NoSync", 2, 2, OptimizerKind::kAdamW, DType::kF32, {kN, kS}),
                      Make("AdamW_Hybrid2x2_bf16", 2, 2, OptimizerKind::kAdamW, DType::kBF16, {kS}),
                      Make("Sgd_RS4_f32_NoSync", 1, 4, OptimizerKind::kSgd, DType::kF32, {kN, kS}),
                      Make("Sgd_RS2_bf16", 1, 2, OptimizerKind::kSgd, DType::kBF16, {kS}),
                      Make("Sgd_Hybrid2x2_bf16_NoSync", 2, 2, OptimizerKind::kSgd, DType::kBF16, {kN, kS}),
                      Make("AdamW_RS2_f32_NoOverlap", 1, 2, OptimizerKind::kAdamW, DType::kF32, {kS}, false)),
    [](const ::testing::TestParamInfo<NamedScenario>& i) { return i.param.name; });

// Control: without readiness events the reductions read gradients before the compute stream
// wrote them (the fake runs a stream's work only when something waits on it), and the same
// comparison fails on every rank.
TEST(NcclOptimizerControlTest, NoReadyEventsIsStale) {
  const NamedScenario c = Make("control", 2, 2, OptimizerKind::kAdamW, DType::kF32, {kS});
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  std::atomic<int> stale{0};
  RunFakeRanks(gpu, 4, FakeConfig(), [&](NcclGroup& world) {
    if (!RunDeviceOptimizer(world, gpu.cuda, kernels, c.s, absl::Seconds(60), /*pass_events=*/false).ok()) ++stale;
  });
  EXPECT_EQ(stale.load(), 4);
}

// Features that need device reductions say so, naming the feature.
TEST(NcclOptimizerErrorsTest, ClippingAndSkipNonfiniteAreUnimplementedOnDevice) {
  for (const bool clip : {true, false}) {
    FakeGpu gpu;
    auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
    RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
      OptScenario s = TwoGroupScenario(1, 2);
      if (clip) {
        s.opt.max_grad_norm = 1.0;
      } else {
        s.opt.skip_nonfinite = true;
      }
      const absl::Status st = RunDeviceOptimizer(world, gpu.cuda, kernels, s);
      EXPECT_TRUE(absl::IsUnimplemented(st)) << st;
      EXPECT_NE(std::string(st.message()).find(clip ? "max_grad_norm" : "skip_nonfinite"), std::string::npos) << st;
    });
    ExpectClean(gpu);
  }
}

TEST(NcclOptimizerErrorsTest, DeviceKernelsRequired) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    const absl::Status st = RunDeviceOptimizer(world, gpu.cuda, nullptr, TwoGroupScenario(1, 2));
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_NE(std::string(st.message()).find("device_kernels"), std::string::npos) << st;
  });
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
