// torch 1.13's _orthogonalize_gram_schmidt (torch/distributed/algorithms/ddp_comm_hooks/
// powerSGD_hook.py), as written there, over a row-major rows x cols matrix: the serial
// reference that PowerSGD's tests hold Braid's kernels and hook to, bit for bit.
//
//   TorchGramSchmidt(q.data(), k, r, /*eps=*/0);  // q's columns orthonormal, torch's order
//
// Each column is normalized by its norm (plus eps when eps > 0), then projected out of every
// later column; every sum runs over the rows in order, in f32, as torch's CPU loops do.
#ifndef BRAID_TESTS_TORCH_GRAM_SCHMIDT_H_
#define BRAID_TESTS_TORCH_GRAM_SCHMIDT_H_

#include <cmath>
#include <cstddef>

namespace braid::testing {

inline void TorchGramSchmidt(float* a, size_t rows, int cols, float eps) {
  for (int i = 0; i < cols; ++i) {
    float sq = 0;
    for (size_t x = 0; x < rows; ++x) sq += a[x * cols + i] * a[x * cols + i];
    const float d = eps == 0 ? std::sqrt(sq) : std::sqrt(sq) + eps;
    for (size_t x = 0; x < rows; ++x) a[x * cols + i] = a[x * cols + i] / d;
    for (int j = i + 1; j < cols; ++j) {
      float dot = 0;
      for (size_t x = 0; x < rows; ++x) dot += a[x * cols + i] * a[x * cols + j];
      for (size_t x = 0; x < rows; ++x) a[x * cols + j] -= dot * a[x * cols + i];
    }
  }
}

}  // namespace braid::testing

#endif  // BRAID_TESTS_TORCH_GRAM_SCHMIDT_H_
