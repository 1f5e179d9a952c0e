// The ShardedOptimizer end to end on a real GPU: a single-rank `nccl` world (one rank per
// device), reducer (reduce-scatter over the one rank), gatherer and optimizer on
// device buffers, gradients copied in on a compute stream with readiness events, the fused CUDA
// AdamW / SGD kernels (CudaStepKernels) on the comm stream; parameters compared bit for bit
// with the serial reference after every step. Multi-rank arithmetic is covered on the fake
// device (nccl_optimizer_test). Skips without a GPU (CUDA error 35 or 100).
//
//   tools/bazelw test //tests/nccl:nccl_optimizer_gpu_test --test_output=all
#include <cuda_runtime.h>

#include <memory>

#include <string>

#include "gtest/gtest.h"
#include "optim/cuda_step_kernels.h"
#include "tests/nccl/device_optimizer_driver.h"
#include "tests/nccl/real_gpu_world.h"

namespace braid::nccl::testing {
namespace {

using optim::OptimizerKind;
using optim::testing::OptScenario;
using optim::testing::SyncMode;

struct GpuCase {
  const char* name;
  int replicas;
  OptimizerKind kind;
  DType dtype;
};

class NcclOptimizerGpuTest : public ::testing::TestWithParam<GpuCase> {};

TEST_P(NcclOptimizerGpuTest, MatchesSerialReference) {
  std::string no_gpu;
  const absl::Status gpu = NoGpuReason(&no_gpu);
  ASSERT_TRUE(gpu.ok()) << gpu;
  if (!no_gpu.empty()) GTEST_SKIP() << no_gpu;
  auto w = MakeRealSingleRankWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  OptScenario s = optim::testing::TwoGroupScenario(GetParam().replicas, 1);
  s.opt.kind = GetParam().kind;
  s.dtype = GetParam().dtype;
  s.schedule = {SyncMode::kNoSync, SyncMode::kSync};
  const absl::Status st = RunDeviceOptimizer(*w->world, w->apis.cuda, optim::CudaStepKernels(), s);
  EXPECT_TRUE(st.ok()) << st;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, NcclOptimizerGpuTest,
    ::testing::Values(GpuCase{"AdamW_RS_f32", 1, OptimizerKind::kAdamW, DType::kF32},
                      GpuCase{"AdamW_RS_bf16", 1, OptimizerKind::kAdamW, DType::kBF16},
                      GpuCase{"Sgd_RS_f32", 1, OptimizerKind::kSgd, DType::kF32},
                      GpuCase{"Sgd_RS_bf16", 1, OptimizerKind::kSgd, DType::kBF16}),
    [](const ::testing::TestParamInfo<GpuCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace braid::nccl::testing
