// CPU reduction and cast kernels shared by the CPU backends (local, mpi, plugins built on them).
//
//   const void* inputs[] = {a, b, c};
//   ReduceInto(inputs, 3, out, count, DType::kBF16, ReduceOp::Avg(), /*group_size=*/3);
//
// ReduceInto combines its inputs strictly in the order given (input 0 first), accumulating in
// f32 for bf16/f16 and narrowing once, so a fixed input order gives bit-identical results
// whatever thread runs it. Outputs of 16 MiB and more are written with non-temporal stores
// (fenced before returning). `out` may alias any input: work proceeds in blocks through a small
// accumulator, reading every input of a block before writing it.
#ifndef BRAID_COMM_REDUCE_KERNELS_H_
#define BRAID_COMM_REDUCE_KERNELS_H_

#include <cstddef>

#include "comm/dtype.h"
#include "comm/reduce_op.h"

namespace braid {

// out[i] = op(inputs[0][i], ..., inputs[n-1][i]); kAvg divides by `group_size`. For
// kPreMulSum each input k is scaled by `scalars[k]` when `scalars` is given (NCCL's premul
// scalar is per rank), else by op.scalar.
// Preconditions (checked by callers): n >= 1, op valid for dtype.
void ReduceInto(const void* const* inputs, int n, void* out, size_t count, DType dtype,
                const ReduceOp& op, int group_size, const double* scalars = nullptr);

// The same, writing the result to each of `n_outs` outputs (a shared-memory all-reduce writes
// a reduced chunk straight into every rank's buffer). Any output may alias any input: each
// block of every input is read before that block of any output is written.
void ReduceIntoMany(const void* const* inputs, int n, void* const* outs, int n_outs, size_t count,
                    DType dtype, const ReduceOp& op, int group_size,
                    const double* scalars = nullptr);

// Element-wise dst = narrow(widen(src) * mul / div) between floating dtypes. The arithmetic is
// f64 when either side is f64, else f32; `mul` is applied only when `apply_mul`, the division
// only when `div > 0`. This is how backends without native bf16/avg/premul stage data:
//   premul:  CastScale(x, kBF16, staging, kF32, n, {true, s, 0})
//   avg:     CastScale(staging, kF32, out, kBF16, n, {false, 1, group_size})
struct ScaleSpec {
  bool apply_mul = false;
  double mul = 1.0;
  int div = 0;
};
void CastScale(const void* src, DType src_type, void* dst, DType dst_type, size_t n,
               const ScaleSpec& scale);

}  // namespace braid

#endif  // BRAID_COMM_REDUCE_KERNELS_H_
