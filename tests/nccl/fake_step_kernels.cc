#include "tests/nccl/fake_step_kernels.h"

#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "optim/norm_math.h"

namespace braid::nccl::testing {
namespace {

absl::Status CheckArgs(const char* kernel, const void* p, const void* grad, size_t n,
                       DType grad_dtype, const void* out, DType out_dtype) {
  const auto ok = [](DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; };
  if (!ok(grad_dtype) || (out != nullptr && !ok(out_dtype)) ||
      (n > 0 && (p == nullptr || grad == nullptr))) {
    return absl::InternalError(absl::StrCat(kernel, ": CUDA error 1: invalid argument"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FakeStepKernels::AdamW(const optim::AdamWScalars& s, float* p, float* m, float* v,
                                    const void* grad, DType grad_dtype, size_t n, void* param_out,
                                    DType out_dtype, DeviceStream stream) {
  if (absl::Status st = CheckArgs("AdamW", p, grad, n, grad_dtype, param_out, out_dtype); !st.ok())
    return st;
  ++launches_;
  auto st = static_cast<cudaStream_t>(stream.handle);
  std::lock_guard<std::mutex> lock(cuda_->mu());
  cuda_->LogLocked(absl::StrCat("AdamWKernel(", n, ",", cuda_->Name(st), ")"));
  cuda_->EnqueueLocked(st, [=] {
    for (size_t i = 0; i < n; ++i) {
      optim::AdamWElement(s, static_cast<float>(LoadElement(grad, grad_dtype, i)), p + i, m + i,
                          v + i);
      if (param_out != nullptr) StoreElement(param_out, out_dtype, i, p[i]);
    }
    return true;
  });
  return absl::OkStatus();
}

absl::Status FakeStepKernels::Sgd(const optim::SgdScalars& s, float* p, float* buf,
                                  const void* grad, DType grad_dtype, size_t n, void* param_out,
                                  DType out_dtype, DeviceStream stream) {
  if (absl::Status st = CheckArgs("Sgd", p, grad, n, grad_dtype, param_out, out_dtype); !st.ok())
    return st;
  if (s.momentum != 0.0f && buf == nullptr && n > 0)
    return absl::InternalError("Sgd: CUDA error 1: no momentum buffer");
  ++launches_;
  auto st = static_cast<cudaStream_t>(stream.handle);
  std::lock_guard<std::mutex> lock(cuda_->mu());
  cuda_->LogLocked(absl::StrCat("SgdKernel(", n, ",", cuda_->Name(st), ")"));
  cuda_->EnqueueLocked(st, [=] {
    for (size_t i = 0; i < n; ++i) {
      optim::SgdElement(s, static_cast<float>(LoadElement(grad, grad_dtype, i)), p + i,
                        buf != nullptr ? buf + i : nullptr);
      if (param_out != nullptr) StoreElement(param_out, out_dtype, i, p[i]);
    }
    return true;
  });
  return absl::OkStatus();
}

absl::Status FakeStepKernels::NormBlockSums(const void* grad, DType grad_dtype, size_t n,
                                            double* block_sums, DeviceStream stream) {
  if (absl::Status st = CheckArgs("NormBlockSums", grad, grad, n, grad_dtype, nullptr, DType::kF32);
      !st.ok()) {
    return st;
  }
  if (n > 0 && block_sums == nullptr)
    return absl::InternalError("NormBlockSums: CUDA error 1: no output");
  ++norm_launches_;
  auto st = static_cast<cudaStream_t>(stream.handle);
  std::lock_guard<std::mutex> lock(cuda_->mu());
  cuda_->LogLocked(absl::StrCat("NormKernel(", n, ",", cuda_->Name(st), ")"));
  cuda_->EnqueueLocked(st, [=] {
    for (size_t k = 0; k < optim::NormBlocks(n); ++k) {
      const size_t lo = k * optim::kNormBlock;
      block_sums[k] = optim::NormBlockSum(
          [&](size_t i) { return static_cast<float>(LoadElement(grad, grad_dtype, lo + i)); },
          std::min(optim::kNormBlock, n - lo));
    }
    return true;
  });
  return absl::OkStatus();
}

}  // namespace braid::nccl::testing
