// FakeStepKernels: the optimizer's device step kernels (optim/step_kernels.h) on the fake device
// (fake_cuda_api.h): each launch is queued on its fake stream and, when the stream reaches it,
// applies optim/adamw_math.h's AdamWElement / SgdElement to every element in host memory (the
// rules the CUDA kernels match bit for bit), widening and narrowing as comm/element.h does;
// NormBlockSums applies optim/norm_math.h's NormBlockSum to each block.
//
//   auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
//   OptimizerConfig cfg;
//   cfg.device_kernels = kernels;
#ifndef BRAID_TESTS_NCCL_FAKE_STEP_KERNELS_H_
#define BRAID_TESTS_NCCL_FAKE_STEP_KERNELS_H_

#include <atomic>
#include <memory>

#include "optim/step_kernels.h"
#include "tests/nccl/fake_cuda_api.h"

namespace braid::nccl::testing {

class FakeStepKernels final : public optim::DeviceStepKernels {
 public:
  explicit FakeStepKernels(std::shared_ptr<FakeCudaApi> cuda) : cuda_(std::move(cuda)) {}
  absl::Status AdamW(const optim::AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                     DType grad_dtype, size_t n, void* param_out, DType out_dtype,
                     DeviceStream stream) override;
  absl::Status Sgd(const optim::SgdScalars& s, float* p, float* buf, const void* grad,
                   DType grad_dtype, size_t n, void* param_out, DType out_dtype,
                   DeviceStream stream) override;
  absl::Status NormBlockSums(const void* grad, DType grad_dtype, size_t n, double* block_sums,
                             DeviceStream stream) override;

  int launches() const { return launches_.load(); }
  int norm_launches() const { return norm_launches_.load(); }

 private:
  std::shared_ptr<FakeCudaApi> cuda_;
  std::atomic<int> launches_{0};
  std::atomic<int> norm_launches_{0};
};

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_FAKE_STEP_KERNELS_H_
