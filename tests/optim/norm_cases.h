// Gradients for the device squared-norm tests (the fake device in tests/nccl, the CUDA kernel in
// tests/optim/norm_cuda_test): awkward sizes around the norm's block and lane boundaries
// (optim/norm_math.h), every gradient dtype, values across many binades (so a different
// summation order rounds differently), and inf / NaN cases. The expected value is the host's
// SquaredNormF64 (optim/grad_stats.cc).
//
//   for (const NormCase& c : NormCases()) {
//     ... device block sums of c.raw ... ;
//     EXPECT_TRUE(SameNorm(HostNorm(c), NormSumBlocks(sums.data(), sums.size())));
//   }
#ifndef BRAID_TESTS_OPTIM_NORM_CASES_H_
#define BRAID_TESTS_OPTIM_NORM_CASES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/dtype.h"

namespace braid::optim::testing {

struct NormCase {
  std::string name;  // e.g. "bf16_n4097_nan"
  DType dtype;
  size_t n;
  std::vector<uint8_t> raw;  // n elements of dtype
};

std::vector<NormCase> NormCases();

// SquaredNormF64 of the case on the host (serial; the pooled version is the same by contract).
double HostNorm(const NormCase& c);

// Bit-identical doubles, except that any NaN equals any NaN (a GPU's NaN payload may differ).
bool SameNorm(double want, double got);

}  // namespace braid::optim::testing

#endif  // BRAID_TESTS_OPTIM_NORM_CASES_H_
