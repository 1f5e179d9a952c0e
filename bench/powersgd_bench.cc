// PowerSGD's arithmetic per compressed step (scheduler/hooks/low_rank.h) against the serial
// loops it replaced, measured in this binary. One iteration is one rank's kernel work of one
// step of bench/hooks_hosts' model (--scale=0.0625: the 50 matrices it compresses, 7.77 M
// elements): per matrix orth(Q), P = M Q, orth(P), Q = M^T P, M' = P Q^T and error = M - M'.
//
//   tools/bazelw build //bench:powersgd_bench && bazel-bin/bench/powersgd_bench
//       --benchmark_repetitions=5 --benchmark_report_aggregates_only=true   (one command line)
//
//   BM_PowerSGDStep/serial/r:R/parts:15      the loops of the serial reference
//                      (tests/powersgd_test.cc), one output at a time, as the hook ran them
//   BM_PowerSGDStep/vectorized/r:R/parts:15  low_rank.h (AVX2 when built with it): the same
//                      sums in the same order, bit for bit (checked here before timing)
//   .../r:4/parts:P    one part of the step: 1 orth(Q) + orth(P), 2 P = M Q, 4 Q = M^T P,
//                      8 P Q^T with the error
//
// items_per_second counts matrix elements; ratio = serial time / vectorized time, same run.
#include <cstring>
#include <vector>

#include "bench/gbench_main.h"
#include "benchmark/benchmark.h"
#include "comm/check.h"
#include "scheduler/hooks/low_rank.h"

namespace braid::sched {
namespace {

struct Shape {
  size_t n, k;
  int count;
};
// hooks_hosts --scale=0.0625 --blocks=12: wte, wpe, then per block c_attn, attn c_proj, c_fc,
// mlp c_proj, each viewed as (shape[0], -1) as hooks_hosts' Rows does.
constexpr Shape kShapes[] = {{13864, 174, 1}, {256, 192, 1},  {192, 576, 12},
                             {192, 192, 12},  {192, 768, 12}, {768, 192, 12}};

// The loops of the serial reference: each output's sum in ascending index order.
void SerialMatMul(const float* m, const float* q, float* p, size_t n, size_t k, int r) {
  for (size_t a = 0; a < n; ++a)
    for (int c = 0; c < r; ++c) {
      float acc = 0.0f;
      for (size_t j = 0; j < k; ++j) acc += m[a * k + j] * q[j * r + c];
      p[a * r + c] = acc;
    }
}
void SerialMatTMul(const float* m, const float* p, float* q, size_t n, size_t k, int r) {
  for (size_t i = 0; i < k * r; ++i) q[i] = 0.0f;
  for (size_t a = 0; a < n; ++a)
    for (size_t j = 0; j < k; ++j)
      for (int c = 0; c < r; ++c) q[j * r + c] += m[a * k + j] * p[a * r + c];
}
void SerialProduct(const float* p, const float* q, float* out, size_t n, size_t k, int r,
                   const float* in, float* err) {
  for (size_t a = 0; a < n; ++a)
    for (size_t j = 0; j < k; ++j) {
      float acc = 0.0f;
      for (int c = 0; c < r; ++c) acc += p[a * r + c] * q[j * r + c];
      out[a * k + j] = acc;
    }
  for (size_t i = 0; i < n * k; ++i) err[i] = in[i] - out[i];  // the hook's separate pass
}

struct Matrix {
  size_t n, k;
  std::vector<float> m, p, q, out, err;
};

std::vector<Matrix> Matrices(int r) {
  std::vector<Matrix> all;
  uint32_t x = 12345;
  auto next = [&x] {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) / 8388608.0f - 1.0f;
  };
  for (const Shape& s : kShapes)
    for (int i = 0; i < s.count; ++i) {
      Matrix m{s.n,
               s.k,
               std::vector<float>(s.n * s.k),
               std::vector<float>(s.n * r),
               std::vector<float>(s.k * r),
               std::vector<float>(s.n * s.k),
               std::vector<float>(s.n * s.k)};
      for (float& v : m.m) v = next();
      for (float& v : m.q) v = next();
      all.push_back(std::move(m));
    }
  return all;
}

// The parts of a step: bit 0 orth(Q) and orth(P), 1 P = M Q, 2 Q = M^T P, 3 P Q^T and error.
constexpr int kAll = 15;

template <bool kSerial>
void Step(std::vector<Matrix>& all, int r, int parts = kAll) {
  for (Matrix& x : all) {
    if (parts & 1) OrthogonalizeColumns(x.q.data(), x.k, r, 0.0f);
    if (parts & 2) {
      if (kSerial) {
        SerialMatMul(x.m.data(), x.q.data(), x.p.data(), x.n, x.k, r);
      } else {
        MatMul(x.m.data(), x.q.data(), x.p.data(), x.n, x.k, r);
      }
    }
    if (parts & 1) OrthogonalizeColumns(x.p.data(), x.n, r, 0.0f);
    if (parts & 4) {
      if (kSerial) {
        SerialMatTMul(x.m.data(), x.p.data(), x.q.data(), x.n, x.k, r);
      } else {
        MatTMul(x.m.data(), x.p.data(), x.q.data(), x.n, x.k, r);
      }
    }
    if (parts & 8) {
      if (kSerial) {
        SerialProduct(x.p.data(), x.q.data(), x.out.data(), x.n, x.k, r, x.m.data(), x.err.data());
      } else {
        LowRankProduct(x.p.data(), x.q.data(), x.out.data(), x.n, x.k, r, x.m.data(), x.err.data());
      }
    }
  }
}

template <bool kSerial>
void BM_PowerSGDStep(benchmark::State& state) {
  const int r = static_cast<int>(state.range(0));
  std::vector<Matrix> all = Matrices(r);
  {  // the vectorized kernels equal the serial loops bit for bit (two steps: warm start)
    std::vector<Matrix> other = Matrices(r);
    for (int i = 0; i < 2; ++i) {
      Step<true>(all, r);
      Step<false>(other, r);
    }
    for (size_t i = 0; i < all.size(); ++i) {
      BRAID_CHECK(std::memcmp(all[i].err.data(), other[i].err.data(), all[i].err.size() * 4) == 0);
      BRAID_CHECK(std::memcmp(all[i].q.data(), other[i].q.data(), all[i].q.size() * 4) == 0);
    }
  }
  size_t elems = 0;
  for (const Matrix& m : all) elems += m.n * m.k;
  const int parts = static_cast<int>(state.range(1));
  for (auto _ : state) {
    Step<kSerial>(all, r, parts);
    benchmark::DoNotOptimize(all[0].err.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * elems));
}

// Args: r, parts (15: the whole step; 1, 2, 4, 8: one part, see Step).
void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"r", "parts"})->Unit(benchmark::kMillisecond);
  for (int r : {1, 4}) b->Args({r, kAll});
  for (int part : {1, 2, 4, 8}) b->Args({4, part});
}
BENCHMARK_TEMPLATE(BM_PowerSGDStep, true)->Name("BM_PowerSGDStep/serial")->Apply(Args);
BENCHMARK_TEMPLATE(BM_PowerSGDStep, false)->Name("BM_PowerSGDStep/vectorized")->Apply(Args);

}  // namespace
}  // namespace braid::sched

BRAID_BENCHMARK_MAIN("powersgd_bench",
                     "PowerSGD's per-step arithmetic (hooks/low_rank.h), vectorized vs serial");
