// A tiny CUDA kernel built by the nvcc genrule: proves the toolkit wiring (see BUILD.bazel).
#include <cuda_runtime.h>

#include "tests/gpu/scale_kernel.h"

namespace {
__global__ void ScaleKernel(float* x, int n, float s) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= s;
}
}  // namespace

extern "C" int BraidTestScale(float* device_x, int n, float s) {
  ScaleKernel<<<(n + 255) / 256, 256>>>(device_x, n, s);
  return static_cast<int>(cudaGetLastError());
}
