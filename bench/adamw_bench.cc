// The CPU AdamW kernel (optim/adamw_kernel.h) against memory bandwidth, measured in this binary.
//
//   tools/bazelw build //bench:adamw_bench && bazel-bin/bench/adamw_bench
//       --benchmark_min_time=0.5 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//   (one command line)
//
// Every case reports bytes_per_second = 28 B x n x iterations / wall time: AdamW in f32 reads
// p, m, v, g (16 B) and writes p, m, v (12 B). The bf16 case (bf16 grad, bf16 param_out) moves
// 24 + 2 + 2 = 28 B too; its param_out lines are also read for ownership by the cache (write
// allocate), so the DRAM traffic is 30 B, but 28 B is what the step needs and what is counted.
//
//   BM_AdamWVectorized        AdamWRange, one thread
//   BM_AdamWScalar            the AdamWElement loop compiled without vectorization
//   BM_AdamWThreads/n/T       AdamWParallel on a KernelPool of T threads
//   BM_AdamWBf16              AdamWRange with bf16 gradients and a bf16 param_out, one thread
//   BM_Bandwidth/n/T          the baseline: p += g; m += g; v += g (the same 28 B per element,
//                             AVX2) on T threads; ratio = kernel GB/s / baseline GB/s
//   BM_PoolHandOff/T          one empty ParallelFor on T threads: the pool's per-call cost
//
// Buffers are advised for transparent huge pages (every case alike), staggered so that no two
// start at the same offset modulo 4 KiB, and written before timing, so page faults and TLB
// refills are not measured.
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "benchmark/benchmark.h"
#include "comm/check.h"
#include "comm/dtype.h"
#include "comm/half.h"
#include "optim/adamw_kernel.h"
#include "optim/adamw_math.h"
#include "optim/parallel_for.h"

#if defined(__AVX2__)
#include <immintrin.h>

#include "bench/gbench_main.h"
#endif

namespace braid::optim {
namespace {

constexpr int64_t kBytesPerElement = 28;
constexpr size_t kAlign = size_t{2} << 20;

// An owned, pre-faulted array of T starting `stagger` cache lines past a 2 MiB boundary. Arrays
// used together get different staggers: if all started at the same offset modulo 4 KiB, a load
// from one would falsely alias the store just made to another (4K aliasing) and the streams
// would compete for the same cache sets, which slows the tight baseline loop most.
template <typename T>
class Buffer {
 public:
  Buffer(size_t n, T fill, int stagger) {
    const size_t offset = static_cast<size_t>(stagger) * 17 * 64;
    const size_t bytes = (offset + n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
    base_.reset(static_cast<char*>(std::aligned_alloc(kAlign, bytes)));
    BRAID_CHECK(base_ != nullptr);
    madvise(base_.get(), bytes, MADV_HUGEPAGE);  // advisory: ignore failure
    data_ = reinterpret_cast<T*>(base_.get() + offset);
    for (size_t i = 0; i < n; ++i) data_[i] = fill;
  }
  T* get() { return data_; }

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> base_;
  T* data_;
};

AdamWScalars Scalars() { return StepScalars(AdamWHyper{}, /*step=*/10, /*grad_scale=*/1.0); }

void Report(benchmark::State& state, size_t n) {
  state.SetBytesProcessed(kBytesPerElement * static_cast<int64_t>(n) * state.iterations());
}

// The plain loop with auto-vectorization off for this function only (checked with objdump:
// vsqrtss/vdivss, no packed arithmetic). noinline keeps the attribute effective.
__attribute__((noinline, optimize("no-tree-vectorize", "no-tree-slp-vectorize"))) void ScalarAdamW(
    const AdamWScalars& s, float* p, float* m, float* v, const float* g, size_t n) {
  for (size_t i = 0; i < n; ++i) AdamWElement(s, g[i], p + i, m + i, v + i);
}

// The bandwidth baseline: the same streams as AdamW (read p, m, v, g; write p, m, v) with one
// add each, so the core never waits on arithmetic.
void StreamAdd(float* p, float* m, float* v, const float* g, size_t n) {
  size_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), gv));
    _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), gv));
    _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), gv));
  }
#endif
  for (; i < n; ++i) {
    p[i] += g[i];
    m[i] += g[i];
    v[i] += g[i];
  }
}

// f32 optimizer state with f32 gradients. Gradients are small and non-zero, so the moments stay
// normal (no subnormal slow paths) however many iterations run.
struct F32State {
  explicit F32State(size_t n) : p(n, 0.5f, 0), m(n, 1e-4f, 1), v(n, 1e-6f, 2), g(n, 1e-3f, 3) {}
  Buffer<float> p, m, v, g;
};

void BM_AdamWVectorized(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  F32State st(n);
  const AdamWScalars s = Scalars();
  for (auto _ : state) {
    AdamWRange(s, st.p.get(), st.m.get(), st.v.get(), st.g.get(), DType::kF32, n);
    benchmark::ClobberMemory();
  }
  Report(state, n);
}

void BM_AdamWScalar(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  F32State st(n);
  const AdamWScalars s = Scalars();
  for (auto _ : state) {
    ScalarAdamW(s, st.p.get(), st.m.get(), st.v.get(), st.g.get(), n);
    benchmark::ClobberMemory();
  }
  Report(state, n);
}

void BM_AdamWThreads(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto pool_ptr = KernelPool::Create(static_cast<int>(state.range(1))).value();
  KernelPool& pool = *pool_ptr;
  F32State st(n);
  const AdamWScalars s = Scalars();
  for (auto _ : state) {
    AdamWParallel(pool, s, st.p.get(), st.m.get(), st.v.get(), st.g.get(), DType::kF32, n);
    benchmark::ClobberMemory();
  }
  Report(state, n);
}

void BM_AdamWBf16(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  Buffer<float> p(n, 0.5f, 0), m(n, 1e-4f, 1), v(n, 1e-6f, 2);
  Buffer<BF16> g(n, ToBF16(1e-3f), 3), out(n, BF16{0}, 4);
  const AdamWScalars s = Scalars();
  for (auto _ : state) {
    AdamWRange(s, p.get(), m.get(), v.get(), g.get(), DType::kBF16, n, out.get(), DType::kBF16);
    benchmark::ClobberMemory();
  }
  Report(state, n);
}

void BM_Bandwidth(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  auto pool_ptr = KernelPool::Create(static_cast<int>(state.range(1))).value();
  KernelPool& pool = *pool_ptr;
  F32State st(n);
  for (auto _ : state) {
    pool.ParallelFor(n, kKernelGrain, [&](size_t lo, size_t hi) {
      StreamAdd(st.p.get() + lo, st.m.get() + lo, st.v.get() + lo, st.g.get() + lo, hi - lo);
    });
    benchmark::ClobberMemory();
  }
  Report(state, n);
}

// The pool's per-call cost: a ParallelFor that splits but does no work (the workers are still
// spinning from the previous call, as between the buckets of one optimizer step).
void BM_PoolHandOff(benchmark::State& state) {
  auto pool_ptr = KernelPool::Create(static_cast<int>(state.range(0))).value();
  KernelPool& pool = *pool_ptr;
  size_t sink = 0;
  const std::function<void(size_t, size_t)> fn = [&sink](size_t lo, size_t) {
    benchmark::DoNotOptimize(sink += lo);
  };
  for (auto _ : state) pool.ParallelFor(2 * kKernelGrain, kKernelGrain, fn);
}
BENCHMARK(BM_PoolHandOff)->Arg(1)->Arg(2)->UseRealTime();

constexpr int64_t k10M = 10'000'000;
constexpr int64_t k100M = 100'000'000;

// Registered size by size with each kernel next to its baseline, so the pairs that form a ratio
// run close together in time (the memory bandwidth of a shared VM drifts by 10-20%).
#define BRAID_ADAMW_BENCH_SIZE(n)                                                      \
  BENCHMARK(BM_Bandwidth)->Args({n, 1})->UseRealTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK(BM_AdamWVectorized)->Arg(n)->UseRealTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK(BM_AdamWBf16)->Arg(n)->UseRealTime()->Unit(benchmark::kMillisecond);       \
  BENCHMARK(BM_AdamWScalar)->Arg(n)->UseRealTime()->Unit(benchmark::kMillisecond);     \
  BENCHMARK(BM_Bandwidth)->Args({n, 2})->UseRealTime()->Unit(benchmark::kMillisecond); \
  BENCHMARK(BM_AdamWThreads)->Args({n, 2})->UseRealTime()->Unit(benchmark::kMillisecond)

BRAID_ADAMW_BENCH_SIZE(k10M);
BRAID_ADAMW_BENCH_SIZE(k100M);

}  // namespace
}  // namespace braid::optim

BRAID_BENCHMARK_MAIN("adamw_bench",
                     "The CPU AdamW kernel against memory bandwidth (bytes_per_second = 28 B x n x "
                     "iterations / wall time).");
