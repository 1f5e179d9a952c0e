// KernelApi: Braid's own CUDA kernels (kernels/bucket_kernels.h) behind a thin interface, as
// CudaApi is for the runtime, so the code that launches them (nccl_buffer_ops.h) runs on CPU
// against a fake that executes the CPU reference (kernels/bucket_reference.h) on a fake stream
// (tests/nccl/fake_kernel_api.h).
//
//   int rc = apis.kernels->CastScale(src, kBF16, dst, kF32, n, kernels::ScaleArgs{}, stream);
//   rc = apis.kernels->Add(partial, shard, partial, n, kF16, stream);
//
// Arguments and results are those of the launchers (dtype codes of kernels/bucket_convert.h,
// a cudaError_t value as an int).
#ifndef BRAID_BACKENDS_NCCL_KERNEL_API_H_
#define BRAID_BACKENDS_NCCL_KERNEL_API_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backends/nccl/kernels/bucket_convert.h"

namespace braid::nccl {

class KernelApi {
 public:
  virtual ~KernelApi() = default;
  // kernels::CastScaleLaunch: dst[i] = braid::CastScale's element with `scale`, queued on
  // `stream`.
  virtual int CastScale(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                        const kernels::ScaleArgs& scale, cudaStream_t stream) = 0;
  // kernels::AddLaunch: dst[i] = a[i] + b[i] (f32 accumulation, one rounding), queued on
  // `stream`; dst may alias a or b.
  virtual int Add(const void* a, const void* b, void* dst, size_t n, int dtype,
                  cudaStream_t stream) = 0;
  // kernels::BucketKernelsErrorString.
  virtual const char* ErrorString(int code) = 0;
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_KERNEL_API_H_
