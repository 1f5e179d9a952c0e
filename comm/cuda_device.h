// Whether this machine has a device that can run Braid's CUDA kernels: the nvcc genrules
// (optim/, backends/nccl/kernels/) build sm_90 SASS and compute_90 PTX only, so a device of
// compute capability 9 or more is needed. No CUDA header here: any host code may include it.
#ifndef BRAID_COMM_CUDA_DEVICE_H_
#define BRAID_COMM_CUDA_DEVICE_H_

namespace braid {

// 0 (cudaSuccess) when the current device can run the kernels; else a cudaError_t value as an
// int: the runtime's error (35 or 100 without a GPU), cudaErrorNoDevice for a device count of
// 0, cudaErrorNoKernelImageForDevice for an older device.
int CudaKernelDeviceStatus();

}  // namespace braid

#endif  // BRAID_COMM_CUDA_DEVICE_H_
