// The gradient squared-norm rule, one block at a time: the definition the CPU (grad_stats.cc,
// scalar tail and AVX2 body), the fake device (tests/nccl/fake_step_kernels) and the CUDA kernel
// (norm_cuda.cu) all reproduce bit for bit. Plain C++ that nvcc also compiles (host + device).
//
//   SquaredNormF64(g, n) = ((0 + B(0)) + B(1)) + ...   over blocks of kNormBlock elements, the
//   last one short; B(k) = NormBlockSum over that block's elements:
//     lane[i % 16] += (double)g[i] * (double)g[i]      for i increasing, lanes from +0.0
//     B = pairwise tree of the 16 lanes: ((l0+l1)+(l2+l3))+... (adjacent pairs, then pairs of
//         pairs)
//
// Why this is reproducible in parallel: blocks are independent (a GPU thread per lane, a CTA
// slice per block); only the final sum over blocks is sequential, and that is done on the host
// from the copied-back block sums (NormSumBlocks). A widened float squared is exact in double,
// so a fused multiply-add of `lane + x * x` rounds the same as the separate operations.
#ifndef BRAID_OPTIM_NORM_MATH_H_
#define BRAID_OPTIM_NORM_MATH_H_

#include <cstddef>

#if defined(__CUDACC__)
#define BRAID_NORM_HD __host__ __device__
#else
#define BRAID_NORM_HD
#endif

namespace braid::optim {

inline constexpr size_t kNormBlock = 4096;  // elements per block
inline constexpr size_t kNormLanes = 16;    // accumulators per block

// Blocks of n elements (the last may be short); 0 for n == 0.
BRAID_NORM_HD inline size_t NormBlocks(size_t n) { return (n + kNormBlock - 1) / kNormBlock; }

// The exact square of one widened gradient element.
BRAID_NORM_HD inline double NormSquare(float x) {
  const double d = static_cast<double>(x);
  return d * d;
}

// The pairwise tree over the 16 lanes (overwrites lane[]).
BRAID_NORM_HD inline double NormLaneTree(double* lane) {
  for (size_t width = kNormLanes; width > 1; width /= 2) {
    for (size_t j = 0; j < width / 2; ++j) lane[j] = lane[2 * j] + lane[2 * j + 1];
  }
  return lane[0];
}

// B over `len` elements, element i widened by load(i) (a float).
template <typename Load>
BRAID_NORM_HD inline double NormBlockSum(const Load& load, size_t len) {
  double lane[kNormLanes] = {};
  for (size_t i = 0; i < len; ++i) lane[i % kNormLanes] += NormSquare(load(i));
  return NormLaneTree(lane);
}

// ((0 + s[0]) + s[1]) + ... : the sequential sum over block sums.
inline double NormSumBlocks(const double* sums, size_t blocks) {
  double total = 0.0;
  for (size_t b = 0; b < blocks; ++b) total += sums[b];
  return total;
}

}  // namespace braid::optim

#endif  // BRAID_OPTIM_NORM_MATH_H_
