#include "tests/optim/norm_cases.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "optim/adamw_kernel.h"

namespace braid::optim::testing {

std::vector<NormCase> NormCases() {
  const size_t B = kNormBlock;
  const std::vector<size_t> sizes = {0, 1, 15, 16, 17, B - 1, B, B + 1, 3 * B + 5, 300007};
  std::vector<NormCase> cases;
  std::mt19937 rng(11);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (size_t n : sizes) {
      for (const char* bad : {"", "inf", "nan"}) {
        if (n == 0 && bad[0] != '\0') continue;
        NormCase c{absl::StrCat(DTypeName(t), "_n", n, bad[0] ? "_" : "", bad), t, n, {}};
        c.raw.resize(n * DTypeSize(t));
        std::uniform_real_distribution<float> mant(1.0f, 2.0f);
        std::uniform_int_distribution<int> exp(-20, 14);  // below 2^15: f16 stays finite
        for (size_t i = 0; i < n; ++i) {
          const float x = std::ldexp(mant(rng), exp(rng));
          StoreElement(c.raw.data(), t, i, (rng() & 1u) ? -x : x);
        }
        if (bad[0] != '\0') {
          const float v = bad[1] == 'n' ? std::numeric_limits<float>::infinity()
                                        : std::numeric_limits<float>::quiet_NaN();
          StoreElement(c.raw.data(), t, n / 2, v);
        }
        cases.push_back(std::move(c));
      }
    }
  }
  return cases;
}

double HostNorm(const NormCase& c) { return SquaredNormF64(c.raw.data(), c.dtype, c.n); }

bool SameNorm(double want, double got) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  return std::memcmp(&want, &got, sizeof want) == 0;
}

}  // namespace braid::optim::testing
