#include "tests/nccl/fake_kernel_api.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "backends/nccl/kernels/bucket_convert.h"
#include "backends/nccl/kernels/bucket_reference.h"

namespace braid::nccl::testing {

int FakeKernelApi::CastScale(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                             float scale, cudaStream_t stream) {
  if (!kernels::ValidDType(src_dtype) || !kernels::ValidDType(dst_dtype) ||
      ((src == nullptr || dst == nullptr) && n > 0)) {
    return cudaErrorInvalidValue;
  }
  ++launches_;
  std::lock_guard<std::mutex> lock(cuda_->mu());
  cuda_->LogLocked(absl::StrCat("CastScaleKernel(", n, ",", cuda_->Name(stream), ")"));
  cuda_->EnqueueLocked(stream, [=] {
    kernels::CastScaleReference(src, src_dtype, dst, dst_dtype, n, scale);
    return true;
  });
  return cudaSuccess;
}

const char* FakeKernelApi::ErrorString(int code) {
  return cuda_->ErrorString(static_cast<cudaError_t>(code));
}

}  // namespace braid::nccl::testing
