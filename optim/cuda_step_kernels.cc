#include "optim/cuda_step_kernels.h"

#include "absl/strings/str_cat.h"
#include "optim/adamw_cuda.h"

namespace braid::optim {
namespace {

absl::Status LaunchStatus(int rc, const char* kernel, size_t n, DType grad, DType out) {
  if (rc == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(kernel, " (", n, " elements, grad ", DTypeName(grad),
                                          ", out ", DTypeName(out), "): CUDA error ", rc, ": ",
                                          CudaErrorString(rc)));
}

class CudaKernels final : public DeviceStepKernels {
 public:
  absl::Status AdamW(const AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                     DType grad_dtype, size_t n, void* param_out, DType out_dtype,
                     DeviceStream stream) override {
    return LaunchStatus(AdamWCudaLaunch(s, p, m, v, grad, static_cast<int>(grad_dtype), n,
                                        param_out, static_cast<int>(out_dtype), stream.handle),
                        "AdamWCudaLaunch", n, grad_dtype, out_dtype);
  }
  absl::Status Sgd(const SgdScalars& s, float* p, float* buf, const void* grad, DType grad_dtype,
                   size_t n, void* param_out, DType out_dtype, DeviceStream stream) override {
    return LaunchStatus(SgdCudaLaunch(s, p, buf, grad, static_cast<int>(grad_dtype), n, param_out,
                                      static_cast<int>(out_dtype), stream.handle),
                        "SgdCudaLaunch", n, grad_dtype, out_dtype);
  }
  absl::Status NormBlockSums(const void* grad, DType grad_dtype, size_t n, double* block_sums,
                             DeviceStream stream) override {
    return LaunchStatus(
        NormBlockSumsCudaLaunch(grad, static_cast<int>(grad_dtype), n, block_sums, stream.handle),
        "NormBlockSumsCudaLaunch", n, grad_dtype, DType::kF64);
  }
};

}  // namespace

std::shared_ptr<DeviceStepKernels> CudaStepKernels() { return std::make_shared<CudaKernels>(); }

}  // namespace braid::optim
