// The element arithmetic of NCCL 2.28.9's reductions, for the fake (fake_nccl_api.h): what one
// output element of an all-reduce / reduce-scatter holds, given the ranks' inputs in rank
// order. The fake must compute what NCCL computes, so the tests' expectations are NCCL's
// rounding, not a nicer one.
//
//   const void* in[] = {rank0, rank1, rank2};
//   void* out[] = {rank0_recv, rank1_recv, rank2_recv};
//   FakeNcclReduce(in, 3, out, 3, count, DType::kBF16, FakeRedOp::kAvg, nullptr);
//
// From the NCCL source (v2.28.x):
//  - src/enqueue.cc, hostToDevRedOp(), case ncclAvg: floating types become ncclDevPreMulSum
//    with the scalar 1/nranks computed as double 1.0/nRanks and converted: f64 keeps the double,
//    f32 float(1.0/n), f16 __float2half(float(1.0/n)), bf16 __float2bfloat16(float(1.0/n))
//    (both round to nearest even); integer types become ncclDevSumPostDiv with nRanks (and a
//    signedness bit).
//  - src/device/reduce_kernel.h: Apply_PreOp<FuncPreMulSum<T>> multiplies each rank's input by
//    the scalar once, in T (f16/bf16: __hmul, one rounding of the exact product to T; f32/f64:
//    x * scalar); Apply_Reduce<FuncPreMulSum<T>> is FuncSum<T>: every addition is in T
//    (f16/bf16: __hadd, rounded to T after each add; f32 / f64 adds). FuncSumPostDiv<int>::divide
//    is the wrapped integer sum divided by nranks, truncated toward zero (|x| / n, sign put
//    back). A user pre-mul-sum op (ncclRedOpCreatePreMulSum) is the same PreMulSum with the
//    user's scalar (already in T). A plain sum on f16/bf16 rounds after each add as well.
// Two differences remain, by design of a fake: the order of the additions is rank order (NCCL's
// ring and tree orders depend on the topology), and __hadd / __hmul are computed as f32 then
// rounded, which equals the direct rounding (f32 has more than 2 * 11 + 2 significand bits).
#ifndef BRAID_TESTS_NCCL_FAKE_NCCL_REDUCE_H_
#define BRAID_TESTS_NCCL_FAKE_NCCL_REDUCE_H_

#include <cstddef>

#include "comm/dtype.h"

namespace braid::nccl::testing {

enum class FakeRedOp { kSum, kAvg, kPreMulSum, kMax, kMin };

// The scalar ncclAvg premultiplies by for a floating `dtype` over `nranks`, as a double holding
// the value in the dtype (f32: float(1.0/n); bf16/f16: that float rounded to nearest even).
double NcclAvgScalar(DType dtype, int nranks);

// out_k[i] = NCCL's op over inputs[0..n)[i] for every output k; `scalars` (kPreMulSum) holds
// each rank's scalar (in the dtype). Any output may alias any input (element i of every input
// is read before element i of any output is written).
void FakeNcclReduce(const void* const* inputs, int n, void* const* outs, int n_outs, size_t count,
                    DType dtype, FakeRedOp op, const double* scalars);

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_FAKE_NCCL_REDUCE_H_
