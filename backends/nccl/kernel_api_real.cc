#include "backends/nccl/kernel_api_real.h"

#include "backends/nccl/kernels/bucket_kernels.h"

namespace braid::nccl {
namespace {

class RealKernels final : public KernelApi {
 public:
  int CastScale(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n, float scale,
                cudaStream_t stream) override {
    return kernels::CastScaleLaunch(src, src_dtype, dst, dst_dtype, n, scale, stream);
  }
  const char* ErrorString(int code) override { return kernels::BucketKernelsErrorString(code); }
};

}  // namespace

std::shared_ptr<KernelApi> RealKernelApi() { return std::make_shared<RealKernels>(); }

}  // namespace braid::nccl
