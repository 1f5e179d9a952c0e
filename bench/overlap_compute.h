// The simulated backward compute of bench/overlap: a fixed amount of real CPU work that writes a
// layer's gradients, calibrated once so that it takes a chosen time on one uncontended thread.
//
//   const double rate = CalibrateWritesPerUs(/*elems=*/layer_elems);     // before any rank runs
//   const size_t writes = std::max(layer_elems, size_t(rate * layer_compute_us));
//   WriteGradients(spans, rank, writes);   // spans: the layer's GradViews
//
// The work is a fixed number of element writes, not "spin until the clock says so": when
// communication threads or other ranks share the cores, the same work takes longer, exactly as
// a real backward would. Every element gets GradValue(i, rank) (i = index in its parameter),
// the first pass covers the whole layer and later passes rewrite it cyclically, so the
// gradients' final content is known and the reduced result can be checked exactly:
// averaging over n ranks gives (i & 7) + (n - 1) / 2, exact in f32.
#ifndef BRAID_BENCH_OVERLAP_COMPUTE_H_
#define BRAID_BENCH_OVERLAP_COMPUTE_H_

#include <cstddef>
#include <vector>

namespace braid::bench {

struct GradSpan {
  float* data = nullptr;
  size_t count = 0;
};

inline float GradValue(size_t i, int rank) {
  return static_cast<float>(static_cast<int>(i & 7) + rank);
}

// Writes `writes` elements (at least one full pass is the caller's business) cycling over
// `spans` in order: plain 32-byte stores of the repeating 8-value pattern, i.e. the work
// streams through the layer's gradients at the core's store bandwidth.
void WriteGradients(const std::vector<GradSpan>& spans, int rank, size_t writes);

// Element writes per microsecond of WriteGradients on this thread over a private buffer of
// `elems` floats: the median of `trials` runs of about 20 ms each.
double CalibrateWritesPerUs(size_t elems, int trials = 7);

}  // namespace braid::bench

#endif  // BRAID_BENCH_OVERLAP_COMPUTE_H_
