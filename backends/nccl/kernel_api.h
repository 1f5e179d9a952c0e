// KernelApi: Braid's own CUDA kernels (kernels/bucket_kernels.h) behind a thin interface, as
// CudaApi is for the runtime, so the code that launches them (nccl_buffer_ops.h) runs on CPU
// against a fake that executes the CPU reference (kernels/bucket_reference.h) on a fake stream
// (tests/nccl/fake_kernel_api.h).
//
//   int rc = apis.kernels->CastScale(src, kBF16, dst, kF32, n, 1.0f, stream);
//
// Arguments and results are those of the launchers (dtype codes of kernels/bucket_convert.h,
// a cudaError_t value as an int).
#ifndef BRAID_BACKENDS_NCCL_KERNEL_API_H_
#define BRAID_BACKENDS_NCCL_KERNEL_API_H_

#include <cuda_runtime_api.h>

#include <cstddef>

namespace braid::nccl {

class KernelApi {
 public:
  virtual ~KernelApi() = default;
  // kernels::CastScaleLaunch: dst[i] = narrow(widen(src[i]) * scale), queued on `stream`.
  virtual int CastScale(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                        float scale, cudaStream_t stream) = 0;
  // kernels::BucketKernelsErrorString.
  virtual const char* ErrorString(int code) = 0;
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_KERNEL_API_H_
