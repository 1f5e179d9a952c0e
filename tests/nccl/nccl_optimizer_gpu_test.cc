// The ShardedOptimizer end to end on a real GPU: a single-rank `nccl` world (one rank per
// device), reducer (reduce-scatter over the one rank), gatherer and optimizer on
// device buffers, gradients copied in on a compute stream with readiness events, the fused CUDA
// AdamW / SGD kernels (CudaStepKernels) on the comm stream; parameters compared bit for bit
// with the serial reference after every step; global-norm clipping and skip_nonfinite through
// the CUDA norm kernel, and a Save / Load resume. Multi-rank arithmetic is covered on the fake
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
  double max_grad_norm = 0;
  bool skip_inf = false;  // skip_nonfinite, +inf in the gradient at step 1
};

class NcclOptimizerGpuTest : public ::testing::TestWithParam<GpuCase> {};

TEST_P(NcclOptimizerGpuTest, MatchesSerialReference) {
  BRAID_SKIP_WITHOUT_GPU();
  auto w = MakeRealSingleRankWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  OptScenario s = optim::testing::TwoGroupScenario(GetParam().replicas, 1);
  s.opt.kind = GetParam().kind;
  s.dtype = GetParam().dtype;
  s.schedule = {SyncMode::kNoSync, SyncMode::kSync};
  s.opt.max_grad_norm = GetParam().max_grad_norm;
  if (GetParam().skip_inf) {
    s.opt.skip_nonfinite = true;
    s.inf_step = 1;
  }
  const absl::Status st = RunDeviceOptimizer(*w->world, w->apis.cuda, optim::CudaStepKernels(), s);
  EXPECT_TRUE(st.ok()) << st;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, NcclOptimizerGpuTest,
    ::testing::Values(
        GpuCase{"AdamW_RS_f32", 1, OptimizerKind::kAdamW, DType::kF32},
        GpuCase{"AdamW_RS_bf16", 1, OptimizerKind::kAdamW, DType::kBF16},
        GpuCase{"Sgd_RS_f32", 1, OptimizerKind::kSgd, DType::kF32},
        GpuCase{"Sgd_RS_bf16", 1, OptimizerKind::kSgd, DType::kBF16},
        GpuCase{"AdamW_RS_f32_Clip", 1, OptimizerKind::kAdamW, DType::kF32, 0.5},
        GpuCase{"AdamW_RS_bf16_ClipInactive", 1, OptimizerKind::kAdamW, DType::kBF16, 1e6},
        GpuCase{"Sgd_RS_bf16_Clip_SkipInf", 1, OptimizerKind::kSgd, DType::kBF16, 0.5, true},
        GpuCase{"AdamW_RS_f32_SkipInf", 1, OptimizerKind::kAdamW, DType::kF32, 0, true}),
    [](const ::testing::TestParamInfo<GpuCase>& i) { return std::string(i.param.name); });

// Save after 2 steps (device -> host copies), Load into a fresh stack (host -> device), 2 more
// steps: the same parameters as the reference after 4.
TEST(NcclOptimizerGpuStateTest, ResumeIsBitExact) {
  BRAID_SKIP_WITHOUT_GPU();
  auto w = MakeRealSingleRankWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  OptScenario s = optim::testing::TwoGroupScenario(1, 1);
  s.dtype = DType::kBF16;
  s.opt.max_grad_norm = 0.5;
  s.steps = 4;
  const std::string path = ::testing::TempDir() + "/gpu_resume.braid";
  {
    auto st = BuildDeviceStack(*w->world, optim::CudaStepKernels(), s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_TRUE(RunDeviceSteps(**st, w->apis.cuda, s, 0, 2).ok());
    const absl::Status saved = (*st)->opt->Save(path);
    ASSERT_TRUE(saved.ok()) << saved;
  }
  auto st = BuildDeviceStack(*w->world, optim::CudaStepKernels(), s);
  ASSERT_TRUE(st.ok()) << st.status();
  const absl::Status loaded = (*st)->opt->Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded;
  ASSERT_TRUE((*st)->opt->WaitAllParams().ok());
  const absl::Status resumed = RunDeviceSteps(**st, w->apis.cuda, s, 2, 4);  // vs the reference
  EXPECT_TRUE(resumed.ok()) << resumed;
}

}  // namespace
}  // namespace braid::nccl::testing
