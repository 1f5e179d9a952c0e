// The fake device's squared-norm kernel (FakeStepKernels::NormBlockSums, optim/norm_math.h's rule
// on the fake stream) against the host's SquaredNormF64 (optim/grad_stats.cc, AVX2 body and
// thread pool included), bit for bit, on the awkward sizes and inf / NaN cases of
// tests/optim/norm_cases.h: the value the optimizer's device clipping must agree on.
#include <cmath>
#include <string>
#include <vector>

#include "backends/nccl/cuda_handles.h"
#include "comm/element.h"
#include "gtest/gtest.h"
#include "optim/adamw_kernel.h"
#include "optim/norm_math.h"
#include "tests/nccl/fake_gpu.h"
#include "tests/nccl/fake_step_kernels.h"
#include "tests/optim/norm_cases.h"

namespace braid::nccl::testing {
namespace {

using optim::testing::HostNorm;
using optim::testing::NormCase;
using optim::testing::NormCases;
using optim::testing::SameNorm;

TEST(FakeNormKernelTest, BlockSumsMatchHostGradStatsBitForBit) {
  FakeGpu gpu;
  FakeStepKernels kernels(gpu.cuda);
  auto pool_ptr = optim::KernelPool::Create(2).value();
  optim::KernelPool& pool = *pool_ptr;
  int checked = 0;
  {
    auto stream = CudaStream::Create(gpu.cuda, "norm test");
    ASSERT_TRUE(stream.ok()) << stream.status();
    for (const NormCase& c : NormCases()) {
      SCOPED_TRACE(c.name);
      auto grad = DeviceBuffer::Allocate(gpu.cuda, c.raw.size(), "gradient");
      const size_t blocks = optim::NormBlocks(c.n);
      auto sums = DeviceBuffer::Allocate(gpu.cuda, blocks * sizeof(double), "block sums");
      ASSERT_TRUE(grad.ok() && sums.ok());
      ASSERT_EQ(gpu.cuda->MemcpyAsync(grad->get(), c.raw.data(), c.raw.size(),
                                      cudaMemcpyHostToDevice, stream->get()),
                cudaSuccess);
      ASSERT_TRUE(kernels
                      .NormBlockSums(grad->get(), c.dtype, c.n, static_cast<double*>(sums->get()),
                                     DeviceStream{stream->get()})
                      .ok());
      std::vector<double> host(blocks, -1.0);
      ASSERT_EQ(gpu.cuda->MemcpyAsync(host.data(), sums->get(), blocks * sizeof(double),
                                      cudaMemcpyDeviceToHost, stream->get()),
                cudaSuccess);
      ASSERT_TRUE(WaitForStream(gpu.cuda, stream->get(), absl::Now() + absl::Seconds(30)).ok());
      const double want = HostNorm(c), got = optim::NormSumBlocks(host.data(), blocks);
      EXPECT_TRUE(SameNorm(want, got)) << "host " << want << ", fake device " << got;
      // The pooled host version is the same value (the optimizer's host path uses it).
      EXPECT_TRUE(SameNorm(want, optim::SquaredNormF64(pool, c.raw.data(), c.dtype, c.n)));
      if (c.name.find("inf") != std::string::npos) {
        EXPECT_TRUE(std::isinf(got)) << got;
      }
      if (c.name.find("nan") != std::string::npos) {
        EXPECT_TRUE(std::isnan(got)) << got;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 60);
  EXPECT_EQ(kernels.norm_launches(), checked);
  ExpectClean(gpu);
}

// The order matters: these values round differently when the blocks or lanes are added in
// another order, so the bit-exact comparison above tests the blocking, not just the math.
TEST(FakeNormKernelTest, CasesAreOrderSensitive) {
  for (const NormCase& c : NormCases()) {
    if (c.name != "f32_n300007") continue;
    double serial = 0;
    for (size_t i = 0; i < c.n; ++i) {
      const double x = LoadElement(c.raw.data(), c.dtype, i);
      serial += x * x;
    }
    EXPECT_NE(serial, HostNorm(c))
        << "a plain serial sum gives the blocked value: the cases cannot tell orders apart";
    return;
  }
  FAIL() << "no f32_n300007 case";
}

TEST(FakeNormKernelTest, BadArgumentsAreErrors) {
  FakeGpu gpu;
  FakeStepKernels kernels(gpu.cuda);
  double sums[1];
  float grad[1] = {};
  EXPECT_FALSE(kernels.NormBlockSums(grad, DType::kF64, 1, sums, DeviceStream{}).ok());
  EXPECT_FALSE(kernels.NormBlockSums(nullptr, DType::kF32, 1, sums, DeviceStream{}).ok());
  EXPECT_FALSE(kernels.NormBlockSums(grad, DType::kF32, 1, nullptr, DeviceStream{}).ok());
  EXPECT_EQ(kernels.norm_launches(), 0);
}

}  // namespace
}  // namespace braid::nccl::testing
