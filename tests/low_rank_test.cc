// PowerSGD's dense kernels (scheduler/hooks/low_rank.h) against the serial loops of the
// algorithm, bit for bit, at shapes that exercise every vector path and tail: rows and columns
// around multiples of 8, 32 and 64, ranks 1..10 and 16, zeros of both signs in the inputs.
#include "scheduler/hooks/low_rank.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/torch_gram_schmidt.h"

namespace braid::sched {
namespace {

using Vec = std::vector<float>;

Vec Random(size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Vec v(count);
  for (size_t i = 0; i < count; ++i) {
    v[i] = u(gen);
    if (i % 29 == 3) v[i] = 0.0f;
    if (i % 31 == 5) v[i] = -0.0f;
  }
  return v;
}

void ExpectBits(const Vec& got, const Vec& want, const char* what, size_t n, size_t k, int r) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(float)))
        << what << " n=" << n << " k=" << k << " r=" << r << " [" << i << "]: " << got[i] << " vs "
        << want[i];
  }
}

void CheckShape(size_t n, size_t k, int r) {
  const uint32_t seed = static_cast<uint32_t>(n * 1000003 + k * 101 + r);
  const Vec m = Random(n * k, seed), q0 = Random(k * r, seed + 1), p0 = Random(n * r, seed + 2);
  // P = M Q
  Vec want_p(n * r), got_p(n * r, 7.0f);
  for (size_t a = 0; a < n; ++a)
    for (int c = 0; c < r; ++c) {
      float acc = 0;
      for (size_t j = 0; j < k; ++j) acc += m[a * k + j] * q0[j * r + c];
      want_p[a * r + c] = acc;
    }
  MatMul(m.data(), q0.data(), got_p.data(), n, k, r);
  ExpectBits(got_p, want_p, "MatMul", n, k, r);
  // Q = M^T P
  Vec want_q(k * r), got_q(k * r, 7.0f);
  for (size_t j = 0; j < k; ++j)
    for (int c = 0; c < r; ++c) {
      float acc = 0;
      for (size_t a = 0; a < n; ++a) acc += m[a * k + j] * p0[a * r + c];
      want_q[j * r + c] = acc;
    }
  MatTMul(m.data(), p0.data(), got_q.data(), n, k, r);
  ExpectBits(got_q, want_q, "MatTMul", n, k, r);
  // out = P Q^T, err = M - out
  Vec want_o(n * k), want_e(n * k), got_o(n * k, 7.0f), got_e(n * k, 7.0f), plain(n * k, 7.0f);
  for (size_t a = 0; a < n; ++a)
    for (size_t j = 0; j < k; ++j) {
      float acc = 0;
      for (int c = 0; c < r; ++c) acc += p0[a * r + c] * q0[j * r + c];
      want_o[a * k + j] = acc;
      want_e[a * k + j] = m[a * k + j] - acc;
    }
  LowRankProduct(p0.data(), q0.data(), got_o.data(), n, k, r, m.data(), got_e.data());
  ExpectBits(got_o, want_o, "LowRankProduct", n, k, r);
  ExpectBits(got_e, want_e, "LowRankProduct error", n, k, r);
  LowRankProduct(p0.data(), q0.data(), plain.data(), n, k, r);
  ExpectBits(plain, want_o, "LowRankProduct without error", n, k, r);
}

TEST(LowRank, OrthogonalizeEqualsTorchsLoopBitForBit) {
  for (size_t rows : {1, 2, 7, 64, 300})
    for (int cols : {1, 2, 3, 4, 8, 64, 66})
      for (float eps : {0.0f, 1e-8f}) {
        const Vec a = Random(rows * cols, static_cast<uint32_t>(rows * 7 + cols));
        Vec want = a, got = a;
        testing::TorchGramSchmidt(want.data(), rows, cols, eps);
        OrthogonalizeColumns(got.data(), rows, cols, eps);
        ExpectBits(got, want, "OrthogonalizeColumns", rows, 0, cols);
      }
}

TEST(LowRank, KernelsEqualSerialLoopsBitForBit) {
  for (size_t n : {1, 3, 7, 8, 9, 16, 31, 64, 65, 130})
    for (size_t k : {1, 5, 8, 12, 15, 16, 17, 31, 32, 33, 40, 174})
      for (int r : {1, 2, 3, 4, 5, 7, 8, 9, 10, 16}) CheckShape(n, k, r);
}

}  // namespace
}  // namespace braid::sched
