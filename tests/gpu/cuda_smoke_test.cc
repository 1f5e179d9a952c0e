// Build-and-link smoke test of the CUDA/NCCL wiring: NCCL's version matches the headers
// everywhere; with a GPU, an nvcc-built kernel runs and a single-rank NCCL all-reduce works.
// Without one (CUDA error 35 or 100) the device part skips.
#include <cuda_runtime.h>
#include <nccl.h>

#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/scale_kernel.h"

namespace {

bool HaveGpu(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) {
    *why = std::string("no GPU: ") + cudaGetErrorString(e) + " (" + std::to_string(e) + ")";
    return false;
  }
  EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  if (n == 0) *why = "no GPU: device count 0";
  return e == cudaSuccess && n > 0;
}

TEST(CudaSmoke, NcclLibraryMatchesHeaders) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_EQ(NCCL_VERSION_CODE, 22809);  // 2.28.9, as DESIGN/NCCL_NOTES assume
}

TEST(CudaSmoke, KernelAndSingleRankAllReduceOnDevice) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << why;
  constexpr int kN = 1000;
  std::vector<float> host(kN);
  for (int i = 0; i < kN; ++i) host[i] = static_cast<float>(i);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(BraidTestScale(d, kN, 0.5f), 0);
  ncclComm_t comm;
  int dev = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &dev), ncclSuccess);
  ASSERT_EQ(ncclAllReduce(d, d, kN, ncclFloat32, ncclSum, comm, nullptr), ncclSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), d, kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(host[i], 0.5f * i) << i;
  ncclCommDestroy(comm);
  cudaFree(d);
}

}  // namespace
