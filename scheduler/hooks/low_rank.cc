#include "scheduler/hooks/low_rank.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

// Every kernel keeps each output's sum in the serial loop's order (low_rank.h): vectors run
// across independent outputs (rows of P, columns of Q, columns of the product), never across the
// terms of one sum, and each term is a separate multiply and add (-ffp-contract=off), so the AVX2
// paths equal the scalar loops bit for bit (tests/low_rank_test.cc).
namespace braid::sched {
namespace {

void MatMulRows(const float* m, const float* q, float* p, size_t a0, size_t n, size_t k, int r) {
  for (size_t a = a0; a < n; ++a) {
    const float* row = m + a * k;
    for (int c = 0; c < r; ++c) {
      float acc = 0.0f;
      for (size_t j = 0; j < k; ++j) acc += row[j] * q[j * r + c];
      p[a * r + c] = acc;
    }
  }
}

#if defined(__AVX2__)

// P rows a..a+7, columns c0..c0+W-1: the 8 rows' elements of column j of M form one vector
// (an 8 x 8 tile of M transposed in registers), so lane i is row a+i's sum, in ascending j.
template <int W>
void MatMul8Rows(const float* m, const float* q, float* p, size_t k, int r, int c0) {
  __m256 acc[W];
  for (int c = 0; c < W; ++c) acc[c] = _mm256_setzero_ps();
  auto step = [&](__m256 col, size_t j) {
    const float* qj = q + j * r + c0;
    for (int c = 0; c < W; ++c)
      acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(col, _mm256_broadcast_ss(qj + c)));
  };
  size_t j = 0;
  for (; j + 8 <= k; j += 8) {
    auto rows2 = [&](int lo, size_t jj) {  // rows lo (low half) and lo + 4 (high half)
      return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(m + lo * k + jj)),
                                  _mm_loadu_ps(m + (lo + 4) * k + jj), 1);
    };
    const __m256 r0 = rows2(0, j), r1 = rows2(1, j), r2 = rows2(2, j), r3 = rows2(3, j);
    const __m256 r4 = rows2(0, j + 4), r5 = rows2(1, j + 4), r6 = rows2(2, j + 4),
                 r7 = rows2(3, j + 4);
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    step(_mm256_shuffle_ps(t0, t2, 0x44), j);
    step(_mm256_shuffle_ps(t0, t2, 0xEE), j + 1);
    step(_mm256_shuffle_ps(t1, t3, 0x44), j + 2);
    step(_mm256_shuffle_ps(t1, t3, 0xEE), j + 3);
    step(_mm256_shuffle_ps(t4, t6, 0x44), j + 4);
    step(_mm256_shuffle_ps(t4, t6, 0xEE), j + 5);
    step(_mm256_shuffle_ps(t5, t7, 0x44), j + 6);
    step(_mm256_shuffle_ps(t5, t7, 0xEE), j + 7);
  }
  for (; j < k; ++j) {
    step(_mm256_setr_ps(m[j], m[k + j], m[2 * k + j], m[3 * k + j], m[4 * k + j], m[5 * k + j],
                        m[6 * k + j], m[7 * k + j]),
         j);
  }
  alignas(32) float out[W][8];
  for (int c = 0; c < W; ++c) _mm256_store_ps(out[c], acc[c]);
  for (int i = 0; i < 8; ++i)
    for (int c = 0; c < W; ++c) p[i * r + c0 + c] = out[c][i];
}

// MatTMul's inner loop: rows [a0, a1) of M added into qt (Q's columns c0..c0+CW-1 for j's
// j0..j0+w-1, transposed: qt[c][jj], so a vector holds one column's 8 consecutive j's and needs
// no shuffle), RB rows at a time, each row's terms after the previous row's. Rows stream in
// memory order (a walk down a column of M misses the cache on every row); the sums live in the
// L1-resident tile, read and written once per RB rows.
constexpr size_t kTChunk = 256;  // j's of qt (8 KB for 8 columns)

template <int CW, int RB>
void MatTMulRows(const float* m, const float* p, float (*qt)[kTChunk], size_t a0, size_t a1,
                 size_t k, int r, int c0, size_t j0, size_t w) {
  const size_t wv = w / 8 * 8;
  size_t a = a0;
  for (; a + RB <= a1; a += RB) {
    __m256 pb[RB][CW];
    for (int i = 0; i < RB; ++i)
      for (int c = 0; c < CW; ++c) pb[i][c] = _mm256_broadcast_ss(p + (a + i) * r + c0 + c);
    const float* row = m + a * k + j0;
    for (size_t jj = 0; jj < wv; jj += 8) {
      __m256 mv[RB];
      for (int i = 0; i < RB; ++i) mv[i] = _mm256_loadu_ps(row + i * k + jj);
      for (int c = 0; c < CW; ++c) {
        __m256 acc = _mm256_load_ps(&qt[c][jj]);
        for (int i = 0; i < RB; ++i) acc = _mm256_add_ps(acc, _mm256_mul_ps(mv[i], pb[i][c]));
        _mm256_store_ps(&qt[c][jj], acc);
      }
    }
    for (size_t jj = wv; jj < w; ++jj)  // the last w % 8 j's
      for (int c = 0; c < CW; ++c)
        for (int i = 0; i < RB; ++i) qt[c][jj] += row[i * k + jj] * p[(a + i) * r + c0 + c];
  }
  if (RB > 1 && a < a1) MatTMulRows<CW, 1>(m, p, qt, a, a1, k, r, c0, j0, w);
}

// LowRankProduct's inner block: rows [a0, a1) x NV vectors of 8 columns from j0, Q's columns
// c0..c0+cw-1 from `tile`; the first chunk starts each sum at 0, later ones continue `out`.
constexpr size_t kProductCols = 32;
struct ProductBlock {
  const float* p;
  float* out;
  const float* in;
  float* err;  // null: no error (or not the last chunk)
  size_t k;
  int r, c0, cw;
  size_t j0;
};

template <int NV>
void ProductRows(const ProductBlock& b, const float (*tile)[kProductCols], size_t a0, size_t a1) {
  for (size_t a = a0; a < a1; ++a) {
    const size_t at = a * b.k + b.j0;
    float* o = b.out + at;
    __m256 acc[NV];
    for (int v = 0; v < NV; ++v)
      acc[v] = b.c0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(o + 8 * v);
    const float* pa = b.p + a * b.r + b.c0;
    for (int c = 0; c < b.cw; ++c) {
      const __m256 x = _mm256_broadcast_ss(pa + c);
      for (int v = 0; v < NV; ++v)
        acc[v] = _mm256_add_ps(acc[v], _mm256_mul_ps(x, _mm256_load_ps(&tile[c][8 * v])));
    }
    for (int v = 0; v < NV; ++v) {
      _mm256_storeu_ps(o + 8 * v, acc[v]);
      if (b.err != nullptr) {
        const __m256 x = _mm256_loadu_ps(b.in + at + 8 * v);
        _mm256_storeu_ps(b.err + at + 8 * v, _mm256_sub_ps(x, acc[v]));
      }
    }
  }
}

#endif  // __AVX2__

}  // namespace

void MatMul(const float* m, const float* q, float* p, size_t n, size_t k, int r) {
  size_t a = 0;
#if defined(__AVX2__)
  for (; a + 8 <= n; a += 8) {
    for (int c0 = 0; c0 < r; c0 += 4) {
      const float* m8 = m + a * k;
      float* p8 = p + a * r;
      switch (std::min(4, r - c0)) {
        case 4:
          MatMul8Rows<4>(m8, q, p8, k, r, c0);
          break;
        case 3:
          MatMul8Rows<3>(m8, q, p8, k, r, c0);
          break;
        case 2:
          MatMul8Rows<2>(m8, q, p8, k, r, c0);
          break;
        default:
          MatMul8Rows<1>(m8, q, p8, k, r, c0);
      }
    }
  }
#endif
  MatMulRows(m, q, p, a, n, k, r);
}

void MatTMul(const float* m, const float* p, float* q, size_t n, size_t k, int r) {
  // Each q[j][c] sums over a in ascending order, from 0.
#if defined(__AVX2__)
  // Per chunk of up to 8 columns of Q and 256 of its rows: the sums accumulate transposed in a
  // stack tile over every row of M, then go to Q.
  alignas(32) float qt[8][kTChunk];
  for (int c0 = 0; c0 < r; c0 += 8) {
    const int cw = std::min(8, r - c0);
    for (size_t j0 = 0; j0 < k; j0 += kTChunk) {
      const size_t w = std::min(kTChunk, k - j0);
      for (int c = 0; c < cw; ++c) std::fill(qt[c], qt[c] + w, 0.0f);
      switch (cw) {
        case 8:
          MatTMulRows<8, 1>(m, p, qt, 0, n, k, r, c0, j0, w);
          break;
        case 7:
          MatTMulRows<7, 1>(m, p, qt, 0, n, k, r, c0, j0, w);
          break;
        case 6:
          MatTMulRows<6, 1>(m, p, qt, 0, n, k, r, c0, j0, w);
          break;
        case 5:
          MatTMulRows<5, 2>(m, p, qt, 0, n, k, r, c0, j0, w);
          break;
        case 4:
          MatTMulRows<4, 2>(m, p, qt, 0, n, k, r, c0, j0, w);
          break;
        case 3:
          MatTMulRows<3, 4>(m, p, qt, 0, n, k, r, c0, j0, w);
          break;
        case 2:
          MatTMulRows<2, 4>(m, p, qt, 0, n, k, r, c0, j0, w);
          break;
        default:
          MatTMulRows<1, 4>(m, p, qt, 0, n, k, r, c0, j0, w);
      }
      for (size_t j = 0; j < w; ++j)
        for (int c = 0; c < cw; ++c) q[(j0 + j) * r + c0 + c] = qt[c][j];
    }
  }
#else
  for (size_t i = 0; i < k * r; ++i) q[i] = 0.0f;
  for (size_t a = 0; a < n; ++a) {  // row by row of M (cache order)
    const float* row = m + a * k;
    const float* pa = p + a * r;
    for (size_t j = 0; j < k; ++j) {
      for (int c = 0; c < r; ++c) q[j * r + c] += row[j] * pa[c];
    }
  }
#endif
}

void LowRankProduct(const float* p, const float* q, float* out, size_t n, size_t k, int r,
                    const float* in, float* err) {
#if defined(__AVX2__)
  // Blocks of rows x 32 columns of the product; Q's 32 rows for up to 8 of its columns are
  // transposed into a tile once per block, so a lane's terms are contiguous. Several chunks of 8
  // columns (r > 8) continue the same sums through `out`. No masked loads or stores (slow on
  // AMD): the columns past the last multiple of 8 run one at a time, in the same order.
  constexpr size_t kRowBlock = 64;
  alignas(32) float tile[8][kProductCols];
  for (size_t a0 = 0; a0 < n; a0 += kRowBlock) {
    const size_t a1 = std::min(n, a0 + kRowBlock);
    for (size_t j0 = 0; j0 < k; j0 += kProductCols) {
      const size_t w = std::min(kProductCols, k - j0);
      for (int c0 = 0; c0 < r; c0 += 8) {
        const int cw = std::min(8, r - c0);
        for (int c = 0; c < cw; ++c)
          for (size_t j = 0; j < w; ++j) tile[c][j] = q[(j0 + j) * r + c0 + c];
        const ProductBlock blk{p, out, in, c0 + 8 >= r ? err : nullptr, k, r, c0, cw, j0};
        switch (w / 8) {
          case 4:
            ProductRows<4>(blk, tile, a0, a1);
            break;
          case 3:
            ProductRows<3>(blk, tile, a0, a1);
            break;
          case 2:
            ProductRows<2>(blk, tile, a0, a1);
            break;
          case 1:
            ProductRows<1>(blk, tile, a0, a1);
            break;
          default:
            break;
        }
        for (size_t a = a0; a < a1; ++a) {
          for (size_t j = w / 8 * 8; j < w; ++j) {
            const size_t at = a * k + j0 + j;
            float acc = c0 == 0 ? 0.0f : out[at];
            for (int c = 0; c < cw; ++c) acc += p[a * r + c0 + c] * tile[c][j];
            out[at] = acc;
            if (blk.err != nullptr) err[at] = in[at] - acc;
          }
        }
      }
    }
  }
#else
  for (size_t a = 0; a < n; ++a) {
    for (size_t j = 0; j < k; ++j) {
      float acc = 0.0f;
      for (int c = 0; c < r; ++c) acc += p[a * r + c] * q[j * r + c];
      out[a * k + j] = acc;
      if (err != nullptr) err[a * k + j] = in[a * k + j] - acc;
    }
  }
#endif
}

void OrthogonalizeColumns(float* a, size_t rows, int cols, float epsilon) {
  // torch's loop, two passes per column instead of 2 + 2 (cols - 1 - i): column j's dot with
  // column i reads j before any update of this round, so every dot is taken in the pass that
  // normalizes column i (each in ascending x, as apart), and every update in one pass, which
  // also sums the squares of column i + 1 (final once updated), in ascending x.
  constexpr int kMaxCols = 64;
  if (cols > kMaxCols) {  // the loop as torch writes it
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
    return;
  }
  if (cols < 1) return;
  float sq = 0.0f;
  for (size_t x = 0; x < rows; ++x) sq += a[x * cols] * a[x * cols];
  for (int i = 0; i < cols; ++i) {
    const float norm = std::sqrt(sq);
    const float d = epsilon == 0.0f ? norm : norm + epsilon;
    float dot[kMaxCols] = {};
    for (size_t x = 0; x < rows; ++x) {
      float* row = a + x * cols;
      const float v = row[i] / d;
      row[i] = v;
      for (int j = i + 1; j < cols; ++j) dot[j] += v * row[j];
    }
    if (i + 1 == cols) break;
    sq = 0.0f;
    for (size_t x = 0; x < rows; ++x) {
      float* row = a + x * cols;
      for (int j = i + 1; j < cols; ++j) row[j] -= dot[j] * row[i];
      sq += row[i + 1] * row[i + 1];
    }
  }
}

}  // namespace braid::sched
