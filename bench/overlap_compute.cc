#include "bench/overlap_compute.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace braid::bench {

namespace {

// p[i] = GradValue(i, rank) for i < n.
void WritePattern(float* p, size_t n, int rank) {
  float pattern[8];
  for (int k = 0; k < 8; ++k) pattern[k] = GradValue(k, rank);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) std::memcpy(p + i, pattern, sizeof pattern);
  for (; i < n; ++i) p[i] = pattern[i & 7];
}

}  // namespace

void WriteGradients(const std::vector<GradSpan>& spans, int rank, size_t writes) {
  while (writes > 0) {
    for (const GradSpan& s : spans) {
      const size_t n = std::min(s.count, writes);
      WritePattern(s.data, n, rank);
      writes -= n;
      // The stores are the work: keep the compiler from merging repeated passes.
      asm volatile("" ::: "memory");
      if (writes == 0) break;
    }
  }
}

double CalibrateWritesPerUs(size_t elems, int trials) {
  std::vector<float> buffer(std::max<size_t>(elems, 1));
  const std::vector<GradSpan> spans = {GradSpan{buffer.data(), buffer.size()}};
  using Clock = std::chrono::steady_clock;
  // Find a write count that takes about 20 ms, then time `trials` runs of it.
  size_t writes = buffer.size();
  double us = 0;
  for (;;) {
    const auto t0 = Clock::now();
    WriteGradients(spans, 0, writes);
    us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    if (us >= 20000 || writes > (size_t{1} << 40)) break;
    writes *= 2;
  }
  std::vector<double> rates;
  for (int t = 0; t < trials; ++t) {
    const auto t0 = Clock::now();
    WriteGradients(spans, 0, writes);
    us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    rates.push_back(writes / std::max(us, 1e-3));
  }
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return rates[rates.size() / 2];
}

}  // namespace braid::bench
