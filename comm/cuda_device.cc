#include "comm/cuda_device.h"

#include <cuda_runtime.h>

namespace braid {

int CudaKernelDeviceStatus() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return e;
  if (count == 0) return cudaErrorNoDevice;
  int device = 0, major = 0;
  e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (e != cudaSuccess) return e;
  return major >= 9 ? cudaSuccess : cudaErrorNoKernelImageForDevice;
}

}  // namespace braid
