// The soak's offload round (tests/soak_rounds.h): OptimizerConfig::offload on the nccl
// backend's fake device (tests/nccl/fake_gpu.h: "device" memory is host memory, streams run
// only when something waits on them, so a missing wait reads stale data). Reduce-scatter on
// 1, 2 or 4 ranks or hybrid 2x2, f32 / bf16 models, the optimizer draws of RandomizeOptimizer
// (clipping, skip_nonfinite with an inf or NaN step, Step() without overlap), no_sync /
// reduce_scatter_only windows; the parameters are read back after every step and compared
// with the serial reference bit for bit (tests/nccl/device_optimizer_driver.h), then the last
// step's report. No step may run as a device kernel, and nothing on the fake device leaks.
#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/nccl/device_optimizer_driver.h"
#include "tests/nccl/fake_gpu.h"
#include "tests/nccl/fake_step_kernels.h"
#include "tests/soak_rounds.h"

namespace braid::testing {

int OffloadRound(uint64_t seed) {
  std::mt19937_64 rng(seed);
  static const int kMeshes[][2] = {{1, 1}, {1, 2}, {1, 4}, {2, 2}};
  const auto& mesh = kMeshes[rng() % 4];
  optim::testing::OptScenario s = optim::testing::TwoGroupScenario(mesh[0], mesh[1]);
  s.dtype = rng() % 2 ? DType::kBF16 : DType::kF32;
  RandomizeOptimizer(rng, 2 + static_cast<int>(rng() % 2), &s);
  s.bucket_cap_bytes = size_t{256} << (rng() % 5);
  s.schedule = RandomSchedule(rng, s.replicas > 1);
  s.opt.offload = true;
  // Named in every failure (the rank threads do not see a SCOPED_TRACE of this one).
  const std::string what = absl::StrCat("offload round seed ", seed, ": ", DescribeOptimizer(s));
  nccl::testing::FakeGpu gpu;
  auto kernels = std::make_shared<nccl::testing::FakeStepKernels>(gpu.cuda);
  nccl::testing::RunFakeRanks(
      gpu, s.replicas * s.shards, nccl::testing::FakeConfig(), [&](nccl::NcclGroup& world) {
        const absl::Status st = nccl::testing::RunDeviceOptimizer(world, gpu.cuda, kernels, s);
        EXPECT_TRUE(st.ok()) << what << ": rank " << world.rank() << ": " << st;
      });
  SCOPED_TRACE(what);
  nccl::testing::ExpectClean(gpu);
  EXPECT_EQ(kernels->launches(), 0) << "an offloaded step ran as a device kernel";
  return s.steps;
}

}  // namespace braid::testing
