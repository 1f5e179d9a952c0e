// The CUDA squared-norm kernel (NormBlockSumsCudaLaunch, optim/adamw_cuda.cu) against the host's
// SquaredNormF64 (optim/grad_stats.cc), bit for bit, on the awkward sizes and inf / NaN cases of
// tests/optim/norm_cases.h; and its argument checks, which run everywhere. The device cases
// skip without a GPU (CUDA error 35 or 100).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "comm/cuda_device.h"
#include "gtest/gtest.h"
#include "optim/adamw_cuda.h"
#include "optim/cuda_owners.h"
#include "optim/norm_math.h"
#include "tests/optim/norm_cases.h"

namespace braid::optim::testing {
namespace {

TEST(NormCudaTest, BlockSumsMatchTheHostBitForBit) {
  const int rc = CudaKernelDeviceStatus();
  if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
    GTEST_SKIP() << "no GPU: " << CudaErrorString(rc) << " (" << rc << ")";
  }
  ASSERT_EQ(rc, cudaSuccess) << CudaErrorString(rc);
  Stream stream;
  ASSERT_EQ(stream.Create(), cudaSuccess);
  int checked = 0;
  for (const NormCase& c : NormCases()) {
    SCOPED_TRACE(c.name);
    DeviceBuffer grad, sums;
    ASSERT_EQ(grad.Allocate(c.raw.size()), cudaSuccess);
    const size_t blocks = NormBlocks(c.n);
    ASSERT_EQ(sums.Allocate(blocks * sizeof(double), 0xff),
              cudaSuccess);  // NaN-filled: every block written
    ASSERT_EQ(cudaMemcpy(grad.get(), c.raw.data(), c.raw.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(NormBlockSumsCudaLaunch(grad.get(), static_cast<int>(c.dtype), c.n,
                                      reinterpret_cast<double*>(sums.get()), stream.get()),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
    std::vector<double> host(blocks);
    ASSERT_EQ(cudaMemcpy(host.data(), sums.get(), blocks * sizeof(double), cudaMemcpyDeviceToHost),
              cudaSuccess);
    const double want = HostNorm(c), got = NormSumBlocks(host.data(), blocks);
    EXPECT_TRUE(SameNorm(want, got)) << "host " << want << ", device " << got;
    ++checked;
  }
  EXPECT_GT(checked, 60);
}

// Rejected before any CUDA call (host pointers stand in for device buffers, never read).
TEST(NormCudaArgs, BadArgumentsAreInvalidValue) {
  double sums[1] = {};
  float grad[4] = {};
  EXPECT_EQ(NormBlockSumsCudaLaunch(grad, 99, 4, sums, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(NormBlockSumsCudaLaunch(grad, 1 /* f64 */, 4, sums, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(NormBlockSumsCudaLaunch(nullptr, kCudaDTypeF32, 4, sums, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(NormBlockSumsCudaLaunch(grad, kCudaDTypeF32, 4, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(NormBlockSumsCudaLaunch(nullptr, kCudaDTypeBF16, 0, nullptr, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace braid::optim::testing
