// Shared pieces of the CUDA benches (adamw_cuda_bench, bucket_kernels_cuda_bench): event timing
// of enqueued work on the legacy stream, and the device check that makes a bench skip cleanly
// without a GPU.
#ifndef BRAID_BENCH_CUDA_TIMING_H_
#define BRAID_BENCH_CUDA_TIMING_H_

#include <cuda_runtime.h>

#include <cstdio>

#include "comm/cuda_device.h"
#include "optim/cuda_owners.h"

namespace braid::bench {

// Milliseconds per call of `enqueue` (which enqueues one operation on the legacy stream),
// averaged over `iters` calls after `warmup` untimed ones.
template <typename Enqueue>
cudaError_t TimeMs(const Enqueue& enqueue, int warmup, int iters, double* ms) {
  optim::Event start, stop;
  cudaError_t e = start.Create();
  if (e == cudaSuccess) e = stop.Create();
  for (int i = 0; i < warmup && e == cudaSuccess; ++i) e = enqueue();
  if (e == cudaSuccess) e = cudaEventRecord(start.get(), nullptr);
  for (int i = 0; i < iters && e == cudaSuccess; ++i) e = enqueue();
  if (e == cudaSuccess) e = cudaEventRecord(stop.get(), nullptr);
  if (e == cudaSuccess) e = cudaEventSynchronize(stop.get());
  float total = 0.0f;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&total, start.get(), stop.get());
  *ms = static_cast<double>(total) / iters;
  return e;
}

// -1: a device that runs Braid's sm_90 kernels is present (its name printed); else the exit
// code: 0 after printing "no CUDA device: skipped" (CUDA error 35 or 100), 1 for another error.
inline int SkipUnlessCudaDevice() {
  const int status = CudaKernelDeviceStatus();
  if (status == cudaErrorNoDevice || status == cudaErrorInsufficientDriver) {
    std::printf("no CUDA device: skipped (%s, %d)\n",
                cudaGetErrorString(static_cast<cudaError_t>(status)), status);
    return 0;
  }
  if (status != cudaSuccess) {
    std::fprintf(stderr, "CUDA device unusable: %s (%d)\n",
                 cudaGetErrorString(static_cast<cudaError_t>(status)), status);
    return 1;
  }
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    std::printf("device %d: %s\n", device, prop.name);
  }
  return -1;
}

}  // namespace braid::bench

#endif  // BRAID_BENCH_CUDA_TIMING_H_
