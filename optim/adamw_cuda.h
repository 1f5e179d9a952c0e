// Fused CUDA optimizer steps: AdamW (and SGD with momentum) in one pass over device memory.
//
// One kernel launch reads the f32 master weights, the f32 optimizer state and the gradient
// (f32, bf16 or f16), applies the rule of optim/adamw_math.h to every element, writes the
// master weights and state back and, when asked, also writes the updated weight narrowed to the
// model dtype (bf16/f16/f32, round to nearest even exactly as comm/half.h). Doing the narrowing
// in the same pass is the point: a separate cast kernel would re-read all of p.
//
// Bit-exactness: the kernel evaluates AdamWElement / SgdElement of adamw_math.h operation for
// operation (no FMA contraction, correctly rounded sqrt and division), so a host loop over
// AdamWElement is the reference the tests compare against with memcmp. Scalars come from
// StepScalars / SgdStepScalars on the host. NaN *payloads* are the one exception: GPU
// arithmetic returns the canonical NaN where x86 propagates an operand's payload, so a NaN
// stays a NaN but its bits may differ.
//
// This header includes no CUDA header, so any host code may include it. Every function returns
// a cudaError_t value as an int (0 = cudaSuccess); CudaErrorString turns it into text.
//
//   using namespace braid::optim;
//   if (braid::CudaKernelDeviceStatus() != 0) { /* no usable GPU (comm/cuda_device.h) */ }
//   const AdamWScalars s = StepScalars(hyper, step);
//   int rc = AdamWCudaLaunch(s, p, m, v, grad, kCudaDTypeBF16, n, weights_bf16, kCudaDTypeBF16,
//                            stream);
//   if (rc != 0) return absl::InternalError(CudaErrorString(rc));
//
// The launch is asynchronous on `stream` (a cudaStream_t; nullptr means the legacy default
// stream): the buffers must stay alive and untouched until the stream has passed it.
#ifndef BRAID_OPTIM_ADAMW_CUDA_H_
#define BRAID_OPTIM_ADAMW_CUDA_H_

#include <cstddef>

#include "optim/adamw_math.h"

namespace braid::optim {

// Element types the kernels accept, numbered as braid::DType (comm/dtype.h) so a caller passes
// static_cast<int>(dtype). Kept as plain ints here because dtype.h pulls in Abseil, which the
// nvcc-compiled side does not see; tests/optim/adamw_cuda_test.cc static_asserts the match.
inline constexpr int kCudaDTypeF32 = 0;   // DType::kF32
inline constexpr int kCudaDTypeBF16 = 2;  // DType::kBF16
inline constexpr int kCudaDTypeF16 = 3;   // DType::kF16

// cudaGetErrorString for a code returned here (never null).
const char* CudaErrorString(int code);

// One AdamW step over n elements, all device pointers:
//   p, m, v     f32, read and written (master weights, first and second moments)
//   grad        n elements of grad_dtype (kCudaDType*), read only
//   param_out   optional (nullptr: not written): n elements of out_dtype receiving the updated
//               p narrowed to the model dtype; out_dtype is ignored when param_out is null
// Buffers must not overlap (param_out may not alias p, even as f32). Any alignment works; when
// all buffers sit at the same offset modulo 16 bytes the body uses 16-byte (float4) accesses,
// otherwise the kernel falls back to element accesses.
// Returns cudaErrorInvalidValue (1), before touching the device, when grad_dtype (or, with
// param_out, out_dtype) is not one of kCudaDType*, or when n > 0 and p, m, v or grad is null;
// n == 0 with valid dtypes is a successful no-op. Otherwise the launch error (a fault inside
// the kernel surfaces at the next synchronization, as usual).
int AdamWCudaLaunch(const AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                    int grad_dtype, size_t n, void* param_out, int out_dtype, void* stream);

// One SGD step (SgdElement) over n elements, same conventions as AdamWCudaLaunch. `buf` is the
// momentum buffer (f32, read and written); it may be null only when s.momentum == 0.
int SgdCudaLaunch(const SgdScalars& s, float* p, float* buf, const void* grad, int grad_dtype,
                  size_t n, void* param_out, int out_dtype, void* stream);

// The squared-norm block sums of n gradient elements (optim/norm_math.h): block_sums[k] =
// NormBlockSum of elements [k * kNormBlock, min(n, (k + 1) * kNormBlock)), for k <
// NormBlocks(n), f64 device memory, bit for bit with the host's (grad_stats.cc); the caller
// adds them in block order (NormSumBlocks) to get SquaredNormF64. An inf/NaN element makes its
// block's sum non-finite (a NaN's payload may differ from the host's). Returns
// cudaErrorInvalidValue before touching the device for a bad grad_dtype, or n > 0 with a null
// pointer; n == 0 is a successful no-op.
int NormBlockSumsCudaLaunch(const void* grad, int grad_dtype, size_t n, double* block_sums,
                            void* stream);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_ADAMW_CUDA_H_
