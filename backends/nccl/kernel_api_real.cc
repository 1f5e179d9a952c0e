#include "backends/nccl/kernel_api_real.h"

#include "backends/nccl/kernels/bucket_kernels.h"

namespace braid::nccl {
namespace {

class RealKernels final : public KernelApi {
 public:
  int CastScale(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                const kernels::ScaleArgs& scale, cudaStream_t stream) override {
    return kernels::CastScaleLaunch(src, src_dtype, dst, dst_dtype, n, scale, stream);
  }
  int Add(const void* a, const void* b, void* dst, size_t n, int dtype,
          cudaStream_t stream) override {
    return kernels::AddLaunch(a, b, dst, n, dtype, stream);
  }
  const char* ErrorString(int code) override { return kernels::BucketKernelsErrorString(code); }
};

}  // namespace

std::shared_ptr<KernelApi> RealKernelApi() { return std::make_shared<RealKernels>(); }

}  // namespace braid::nccl
