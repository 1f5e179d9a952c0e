#include "tests/nccl/fake_kernel_api.h"

#include <mutex>

#include "absl/strings/str_cat.h"
#include "backends/nccl/kernels/bucket_convert.h"
#include "backends/nccl/kernels/bucket_reference.h"

namespace braid::nccl::testing {

int FakeKernelApi::CastScale(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                             const kernels::ScaleArgs& scale, cudaStream_t stream) {
  if (!kernels::ValidDType(src_dtype) || !kernels::ValidDType(dst_dtype) ||
      ((src == nullptr || dst == nullptr) && n > 0)) {
    return cudaErrorInvalidValue;
  }
  ++launches_;
  if (scale.apply_mul || scale.div > 0) ++scaled_casts_;
  std::lock_guard<std::mutex> lock(cuda_->mu());
  cuda_->LogLocked(absl::StrCat("CastScaleKernel(", n, ",", cuda_->Name(stream), ")"));
  cuda_->EnqueueLocked(stream, [=] {
    kernels::CastScaleReference(src, src_dtype, dst, dst_dtype, n, scale);
    return true;
  });
  return cudaSuccess;
}

int FakeKernelApi::Add(const void* a, const void* b, void* dst, size_t n, int dtype,
                       cudaStream_t stream) {
  if (!kernels::ValidDType(dtype) || ((a == nullptr || b == nullptr || dst == nullptr) && n > 0)) {
    return cudaErrorInvalidValue;
  }
  ++launches_;
  ++adds_;
  std::lock_guard<std::mutex> lock(cuda_->mu());
  cuda_->LogLocked(absl::StrCat("AddKernel(", n, ",", cuda_->Name(stream), ")"));
  cuda_->EnqueueLocked(stream, [=] {
    kernels::AddReference(a, b, dst, n, dtype);
    return true;
  });
  return cudaSuccess;
}

const char* FakeKernelApi::ErrorString(int code) {
  return cuda_->ErrorString(static_cast<cudaError_t>(code));
}

}  // namespace braid::nccl::testing
