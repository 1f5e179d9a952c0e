// DeviceStepKernels: the optimizer's fused element-wise steps (AdamW, SGD) queued on a device
// stream, behind a small interface so the sharded optimizer's device path runs on CPU against a
// fake (tests/nccl/fake_step_kernels.h runs optim/adamw_math.h's rules on the fake stream) and
// on a GPU with the CUDA kernels of adamw_cuda.h (CudaStepKernels(), cuda_step_kernels.h).
//
//   std::shared_ptr<DeviceStepKernels> k = CudaStepKernels();
//   RETURN_IF_ERROR(k->AdamW(StepScalars(h, t), p, m, v, grad, DType::kBF16, n, out,
//                            DType::kBF16, ops.stream()));
//
// Contract: the arguments and the per-element result of AdamWCudaLaunch / SgdCudaLaunch
// (bit for bit with AdamWElement / SgdElement) and NormBlockSumsCudaLaunch (bit for bit with
// optim/norm_math.h's NormBlockSum), all pointers device memory, the work queued on
// `stream` (asynchronous: buffers stay alive and untouched until the stream passed it). Errors
// name the kernel and the CUDA error. Implementations are thread-safe.
#ifndef BRAID_OPTIM_STEP_KERNELS_H_
#define BRAID_OPTIM_STEP_KERNELS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "comm/dtype.h"
#include "comm/tensor.h"
#include "optim/adamw_math.h"
#include "optim/norm_math.h"

namespace braid::optim {

class DeviceStepKernels {
 public:
  virtual ~DeviceStepKernels() = default;
  // AdamWElement over n elements: p, m, v f32 (read and written), grad of grad_dtype, and
  // param_out (optional) receiving p narrowed to out_dtype.
  virtual absl::Status AdamW(const AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                             DType grad_dtype, size_t n, void* param_out, DType out_dtype,
                             DeviceStream stream) = 0;
  // SgdElement over n elements; `buf` may be null when s.momentum == 0.
  virtual absl::Status Sgd(const SgdScalars& s, float* p, float* buf, const void* grad,
                           DType grad_dtype, size_t n, void* param_out, DType out_dtype,
                           DeviceStream stream) = 0;
  // The squared-norm block sums of n gradient elements (grad_dtype f32, bf16 or f16):
  // block_sums[k] (f64, NormBlocks(n) of them) = NormBlockSum of block k, bit for bit with the
  // host's SquaredNormF64 blocks, so NormSumBlocks(block_sums) on the host is SquaredNormF64.
  // Inf / NaN elements make their block's sum non-finite. The default says Unimplemented.
  virtual absl::Status NormBlockSums(const void* grad, DType grad_dtype, size_t n,
                                     double* block_sums, DeviceStream stream) {
    (void)grad, (void)grad_dtype, (void)n, (void)block_sums, (void)stream;
    return absl::UnimplementedError(
        "NormBlockSums: these device step kernels have no gradient-norm kernel");
  }
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_STEP_KERNELS_H_
