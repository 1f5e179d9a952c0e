// Build-and-link smoke test of the CUDA/NCCL wiring: the CUDA runtime is linked statically and
// NCCL is opened at run time (backends/nccl/nccl_library.h); NCCL's version matches the
// headers everywhere; with a GPU, an nvcc-built kernel runs and a single-rank NCCL all-reduce
// works. Without one (CUDA error 35 or 100) the device part skips.
#include <cuda_runtime.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <vector>

#include "backends/nccl/nccl_library.h"
#include "gtest/gtest.h"
#include "tests/gpu/scale_kernel.h"

namespace {

using braid::nccl::NcclLibrary;

struct CudaFree {
  void operator()(float* p) const { cudaFree(p); }
};

std::unique_ptr<NcclLibrary> OpenNccl() {
  auto lib = NcclLibrary::Open(braid::nccl::kDefaultNcclLibrary);
  EXPECT_TRUE(lib.ok()) << lib.status();
  return lib.ok() ? std::move(*lib) : nullptr;
}

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
  const std::unique_ptr<NcclLibrary> nccl = OpenNccl();
  ASSERT_NE(nccl, nullptr);
  int version = 0;
  ASSERT_EQ(nccl->fn().GetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_EQ(NCCL_VERSION_CODE, 22809);  // 2.28.9, as DESIGN/NCCL_NOTES assume
}

TEST(CudaSmoke, KernelAndSingleRankAllReduceOnDevice) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << why;
  constexpr int kN = 1000;
  std::vector<float> host(kN);
  for (int i = 0; i < kN; ++i) host[i] = static_cast<float>(i);
  float* raw = nullptr;
  ASSERT_EQ(cudaMalloc(&raw, kN * sizeof(float)), cudaSuccess);
  const std::unique_ptr<float, CudaFree> owned(raw);
  float* d = owned.get();
  ASSERT_EQ(cudaMemcpy(d, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(BraidTestScale(d, kN, 0.5f), 0);
  const std::unique_ptr<NcclLibrary> nccl = OpenNccl();
  ASSERT_NE(nccl, nullptr);
  ncclComm_t raw_comm;
  int dev = 0;
  ASSERT_EQ(nccl->fn().CommInitAll(&raw_comm, 1, &dev), ncclSuccess);
  const std::unique_ptr<ncclComm, std::function<void(ncclComm_t)>> comm(
      raw_comm, [&](ncclComm_t c) { nccl->fn().CommDestroy(c); });
  ASSERT_EQ(nccl->fn().AllReduce(d, d, kN, ncclFloat32, ncclSum, comm.get(), nullptr), ncclSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), d, kN * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < kN; ++i) ASSERT_EQ(host[i], 0.5f * i) << i;
}

}  // namespace
