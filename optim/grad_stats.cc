// SquaredNormF64 and AllFinite (declared in adamw_kernel.h). The norm's rule (blocks, lanes,
// tree) is optim/norm_math.h's, shared with the device kernels; the AVX2 body below is its
// 16 lanes as four 4-wide vectors.
#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#include "optim/adamw_kernel.h"
#include "optim/kernel_convert.h"
#include "optim/norm_math.h"

namespace braid::optim {
namespace {

using internal::Widen;

constexpr size_t kLanes = kNormLanes;
static_assert(kLanes == 16, "the AVX2 body holds 16 lanes in four vectors");

// NormBlockSum (norm_math.h): lane i % 16 accumulates in increasing i, then the 16 lanes are
// added as a pairwise tree.
template <typename G>
double BlockSum(const G* g, size_t len) {
  alignas(32) double lane[kLanes] = {};
  size_t i = 0;
#if defined(BRAID_OPTIM_AVX2)
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                    _mm256_setzero_pd()};
  for (; i + kLanes <= len; i += kLanes) {
    const __m256 lo = internal::Load8(g + i), hi = internal::Load8(g + i + 8);
    const __m256d d[4] = {
        _mm256_cvtps_pd(_mm256_castps256_ps128(lo)), _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1)),
        _mm256_cvtps_pd(_mm256_castps256_ps128(hi)), _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1))};
    for (int k = 0; k < 4; ++k) acc[k] = _mm256_add_pd(acc[k], _mm256_mul_pd(d[k], d[k]));
  }
  for (int k = 0; k < 4; ++k) _mm256_store_pd(lane + 4 * k, acc[k]);
#endif
  for (; i < len; ++i) lane[i % kLanes] += NormSquare(Widen(g[i]));
  return NormLaneTree(lane);
}

template <typename G>
double BlockSumAt(const void* grad, size_t n, size_t block) {
  const size_t lo = block * kNormBlock;
  return BlockSum(static_cast<const G*>(grad) + lo, std::min(kNormBlock, n - lo));
}

// Blocks summed per hand-off in the pooled version; their sums wait on the stack (8 KB) so
// they can be added in block order afterwards.
constexpr size_t kGroupBlocks = 1024;

// Bit tests for "exponent all ones" (inf or NaN).
inline bool NonFinite(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return (u & 0x7f800000u) == 0x7f800000u;
}
inline bool NonFinite(BF16 x) { return (x.bits & 0x7f80u) == 0x7f80u; }
inline bool NonFinite(F16 x) { return (x.bits & 0x7c00u) == 0x7c00u; }

// Elements checked between early exits: a bad gradient is found within a few cache lines,
// while the common all-finite case pays one test per chunk.
constexpr size_t kFiniteChunk = 256;

template <typename G>
bool AllFiniteTyped(const G* g, size_t n) {
  size_t i = 0;
#if defined(BRAID_OPTIM_AVX2)
  constexpr size_t kPerVector = 32 / sizeof(G);
  const __m256i mask = sizeof(G) == 4            ? _mm256_set1_epi32(0x7f800000)
                       : std::is_same_v<G, BF16> ? _mm256_set1_epi16(0x7f80)
                                                 : _mm256_set1_epi16(0x7c00);
  while (i + kFiniteChunk <= n) {
    __m256i bad = _mm256_setzero_si256();
    for (const size_t end = i + kFiniteChunk; i < end; i += kPerVector) {
      const __m256i x =
          _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + i)), mask);
      bad = _mm256_or_si256(
          bad, sizeof(G) == 4 ? _mm256_cmpeq_epi32(x, mask) : _mm256_cmpeq_epi16(x, mask));
    }
    if (!_mm256_testz_si256(bad, bad)) return false;
  }
#endif
  for (; i < n; ++i) {
    if (NonFinite(g[i])) return false;
  }
  return true;
}

}  // namespace

double SquaredNormF64(const void* grad, DType dtype, size_t n) {
  double total = 0.0;
  internal::WithGradType(dtype, [&](auto gt) {
    using G = decltype(gt);
    for (size_t b = 0; b * kNormBlock < n; ++b) total += BlockSumAt<G>(grad, n, b);
  });
  return total;
}

double SquaredNormF64(KernelPool& pool, const void* grad, DType dtype, size_t n) {
  double total = 0.0;
  const size_t blocks = (n + kNormBlock - 1) / kNormBlock;
  const size_t grain_blocks = std::max<size_t>(1, kKernelGrain / kNormBlock);
  std::array<double, kGroupBlocks> sums;
  internal::WithGradType(dtype, [&](auto gt) {
    using G = decltype(gt);
    for (size_t first = 0; first < blocks; first += kGroupBlocks) {
      const size_t count = std::min(kGroupBlocks, blocks - first);
      pool.ParallelFor(count, grain_blocks, [&](size_t lo, size_t hi) {
        for (size_t b = lo; b < hi; ++b) sums[b] = BlockSumAt<G>(grad, n, first + b);
      });
      for (size_t b = 0; b < count; ++b) total += sums[b];  // block order, as the serial one
    }
  });
  return total;
}

bool AllFinite(const void* grad, DType dtype, size_t n) {
  bool ok = true;
  internal::WithGradType(dtype, [&](auto gt) {
    using G = decltype(gt);
    ok = AllFiniteTyped(static_cast<const G*>(grad), n);
  });
  return ok;
}

}  // namespace braid::optim
