// The dense kernels of PowerSGD (hooks/powersgd.h), on row-major f32 matrices, each sum taken
// in ascending index order (so a serial reference reproduces them bit for bit):
//
//   MatMul(m, q, p, n, k, r);         // P (n x r) = M (n x k) Q (k x r)
//   OrthogonalizeColumns(p, n, r, 0); // torch's _orthogonalize_gram_schmidt
//   MatTMul(m, p, q, n, k, r);        // Q (k x r) = M^T P
//   LowRankProduct(p, q, out, n, k, r, m, err);  // out (n x k) = P Q^T; err = m - out
//
// With AVX2 the products run 8 outputs per vector (8 rows of P, 8 / r rows of Q, 8 columns of
// the product), never splitting one output's sum, so they equal the serial loops bit for bit
// (tests/low_rank_test.cc) at any shape; bench/powersgd_bench.cc measures them against the
// serial loops. LowRankProduct's optional `in` / `err` fuse PowerSGD's error feedback into the
// pass that writes the product (err may not alias in; pass nullptr for neither).
//
// OrthogonalizeColumns computes torch 1.13's Gram-Schmidt bit for bit (every sum in its order, in
// two passes over the matrix per column instead of one per dot and update): column i is divided by
// its 2-norm (+ epsilon when epsilon > 0; a zero column divided by 0 gives NaN, as torch's does
// without epsilon), then its projection is removed from every later column. torch switches to
// LAPACK's QR for ranks above 2; both span the same columns, so P P^T M agrees up to rounding.
#ifndef BRAID_SCHEDULER_HOOKS_LOW_RANK_H_
#define BRAID_SCHEDULER_HOOKS_LOW_RANK_H_

#include <cstddef>

namespace braid::sched {

void MatMul(const float* m, const float* q, float* p, size_t n, size_t k, int r);
void MatTMul(const float* m, const float* p, float* q, size_t n, size_t k, int r);
void LowRankProduct(const float* p, const float* q, float* out, size_t n, size_t k, int r,
                    const float* in = nullptr, float* err = nullptr);
void OrthogonalizeColumns(float* a, size_t rows, int cols, float epsilon);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_HOOKS_LOW_RANK_H_
