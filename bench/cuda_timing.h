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

// A kernel's figures against its baseline: a device-to-device cudaMemcpy moving the same bytes
// (a copy of B bytes moves 2B: read + write), timed in the same run.
struct KernelVsCopy {
  double kernel_ms = 0, kernel_gbps = 0, memcpy_gbps = 0;
};

// Times `kernel` (which moves `bytes_moved` bytes, read + write) and the copy baseline.
template <typename Enqueue>
cudaError_t TimeAgainstCopy(const Enqueue& kernel, size_t bytes_moved, int warmup, int iters,
                            KernelVsCopy* out) {
  optim::DeviceBuffer src, dst;
  cudaError_t e = src.Allocate(bytes_moved / 2, 0x3c);
  if (e == cudaSuccess) e = dst.Allocate(bytes_moved / 2, 0);
  const auto copy = [&] {
    return cudaMemcpyAsync(dst.get(), src.get(), bytes_moved / 2, cudaMemcpyDeviceToDevice,
                           nullptr);
  };
  double copy_ms = 0;
  if (e == cudaSuccess) e = TimeMs(kernel, warmup, iters, &out->kernel_ms);
  if (e == cudaSuccess) e = TimeMs(copy, warmup, iters, &copy_ms);
  if (e != cudaSuccess) return e;
  out->kernel_gbps = static_cast<double>(bytes_moved) / (out->kernel_ms * 1e6);
  out->memcpy_gbps = static_cast<double>(bytes_moved) / (copy_ms * 1e6);
  return cudaSuccess;
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
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    std::printf("device %d: %s\n", device, prop.name);
  }
  return -1;
}

}  // namespace braid::bench

#endif  // BRAID_BENCH_CUDA_TIMING_H_
