// CPU optimizer kernels over a contiguous shard: AdamW and SGD steps fused with the gradient
// widening (f32/bf16/f16 -> f32) and the write of model-dtype parameters, plus the gradient
// statistics that clipping and inf checks need.
//
//   const AdamWScalars s = StepScalars(hyper, step, clip_scale);
//   AdamWRange(s, master, m, v, grad_bf16, DType::kBF16, n, model_params_bf16, DType::kBF16);
//
// Contract: every element gets exactly the f32 operations of AdamWElement / SgdElement
// (optim/adamw_math.h) in that order, so the result is bit-identical to the serial loop, to the
// scalar path, and to any thread count. Widening is exact; narrowing is round-to-nearest-even
// exactly as comm/half.h's ToBF16 / ToF16 (NaNs included). AVX2 + F16C when the build targets
// them (x86-64-v3), else the scalar path.
//
// Why fused: AdamW in f32 moves 28 bytes per parameter (read p, m, v, g; write p, m, v) and does
// little arithmetic, so it is bound by memory bandwidth; a separate cast pass would re-read p.
#ifndef BRAID_OPTIM_ADAMW_KERNEL_H_
#define BRAID_OPTIM_ADAMW_KERNEL_H_

#include <cstddef>

#include "comm/dtype.h"
#include "optim/adamw_math.h"
#include "optim/norm_math.h"
#include "optim/parallel_for.h"

namespace braid::optim {

// One AdamW step over n elements. `grad` is f32, bf16 or f16. If `param_out` is not null it
// receives the updated master weights rounded to `out_dtype` (f32, bf16 or f16). `p`, `m`, `v`
// are updated in place; no alignment is required.
void AdamWRange(const AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                DType grad_dtype, size_t n, void* param_out = nullptr,
                DType out_dtype = DType::kF32);

// The same with one element at a time (the reference, and the non-AVX2 path).
void AdamWRangeScalar(const AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                      DType grad_dtype, size_t n, void* param_out = nullptr,
                      DType out_dtype = DType::kF32);

// One SGD step; `buf` (the momentum buffer) may be null when s.momentum == 0.
void SgdRange(const SgdScalars& s, float* p, float* buf, const void* grad, DType grad_dtype,
              size_t n, void* param_out = nullptr, DType out_dtype = DType::kF32);
void SgdRangeScalar(const SgdScalars& s, float* p, float* buf, const void* grad, DType grad_dtype,
                    size_t n, void* param_out = nullptr, DType out_dtype = DType::kF32);

// Each thread gets at least this many elements (shards under twice it run on the caller): 64K
// elements of AdamW is ~1.8 MB of traffic, ~0.1 ms on one core, which dwarfs the hand-off
// (~0.7 us to spinning workers, tens of us to sleeping ones; bench/adamw_bench).
inline constexpr size_t kKernelGrain = size_t{1} << 16;

// AdamWRange / SgdRange split over `pool` (bit-identical to one call on the whole range).
void AdamWParallel(KernelPool& pool, const AdamWScalars& s, float* p, float* m, float* v,
                   const void* grad, DType grad_dtype, size_t n, void* param_out = nullptr,
                   DType out_dtype = DType::kF32, size_t grain = kKernelGrain);
void SgdParallel(KernelPool& pool, const SgdScalars& s, float* p, float* buf, const void* grad,
                 DType grad_dtype, size_t n, void* param_out = nullptr,
                 DType out_dtype = DType::kF32, size_t grain = kKernelGrain);

// Sum of g*g in double over n gradient elements (f32, bf16 or f16), in a fixed order that
// depends only on n, so the value is the same on every path and for every thread count:
//   - elements are taken in blocks of kNormBlock (the last may be short);
//   - inside a block, element i is added (as the exact double g*g) to lane i % 16, lanes
//     accumulating in increasing i starting from +0.0;
//   - a block's value is the pairwise tree of its 16 lanes: ((l0+l1)+(l2+l3))+... (adjacent
//     pairs, then pairs of pairs);
//   - the result is ((0 + b0) + b1) + ... over blocks in increasing order.
// A NaN or inf gradient gives a non-finite result.
// kNormBlock and the element rule are in optim/norm_math.h (shared with the device kernels).
double SquaredNormF64(const void* grad, DType dtype, size_t n);
double SquaredNormF64(KernelPool& pool, const void* grad, DType dtype, size_t n);

// Whether no element is inf or NaN.
bool AllFinite(const void* grad, DType dtype, size_t n);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_ADAMW_KERNEL_H_
