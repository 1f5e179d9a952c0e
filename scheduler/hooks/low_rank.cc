#include "scheduler/hooks/low_rank.h"

#include <cmath>

namespace braid::sched {

void MatMul(const float* m, const float* q, float* p, size_t n, size_t k, int r) {
  for (size_t a = 0; a < n; ++a) {
    const float* row = m + a * k;
    for (int c = 0; c < r; ++c) {
      float acc = 0.0f;
      for (size_t j = 0; j < k; ++j) acc += row[j] * q[j * r + c];
      p[a * r + c] = acc;
    }
  }
}

void MatTMul(const float* m, const float* p, float* q, size_t n, size_t k, int r) {
  // Row by row of M (cache order); each q[j][c] still sums over a in ascending order.
  for (size_t i = 0; i < k * r; ++i) q[i] = 0.0f;
  for (size_t a = 0; a < n; ++a) {
    const float* row = m + a * k;
    const float* pa = p + a * r;
    for (size_t j = 0; j < k; ++j) {
      for (int c = 0; c < r; ++c) q[j * r + c] += row[j] * pa[c];
    }
  }
}

void LowRankProduct(const float* p, const float* q, float* out, size_t n, size_t k, int r) {
  for (size_t a = 0; a < n; ++a) {
    for (size_t j = 0; j < k; ++j) {
      float acc = 0.0f;
      for (int c = 0; c < r; ++c) acc += p[a * r + c] * q[j * r + c];
      out[a * k + j] = acc;
    }
  }
}

void OrthogonalizeColumns(float* a, size_t rows, int cols, float epsilon) {
  for (int i = 0; i < cols; ++i) {
    float sq = 0.0f;
    for (size_t x = 0; x < rows; ++x) sq += a[x * cols + i] * a[x * cols + i];
    const float norm = std::sqrt(sq);
    const float d = epsilon == 0.0f ? norm : norm + epsilon;
    for (size_t x = 0; x < rows; ++x) a[x * cols + i] /= d;
    for (int j = i + 1; j < cols; ++j) {
      float dot = 0.0f;
      for (size_t x = 0; x < rows; ++x) dot += a[x * cols + i] * a[x * cols + j];
      for (size_t x = 0; x < rows; ++x) a[x * cols + j] -= dot * a[x * cols + i];
    }
  }
}

}  // namespace braid::sched
