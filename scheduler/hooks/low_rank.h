// The dense kernels of PowerSGD (hooks/powersgd.h), on row-major f32 matrices, each sum taken
// in ascending index order (so a serial reference reproduces them bit for bit):
//
//   MatMul(m, q, p, n, k, r);         // P (n x r) = M (n x k) Q (k x r)
//   OrthogonalizeColumns(p, n, r, 0); // torch's _orthogonalize_gram_schmidt
//   MatTMul(m, p, q, n, k, r);        // Q (k x r) = M^T P
//   LowRankProduct(p, q, out, n, k, r);  // out (n x k) = P Q^T
//
// OrthogonalizeColumns follows torch 1.13's Gram-Schmidt step for step: column i is divided by
// its 2-norm (+ epsilon when epsilon > 0; a zero column divided by 0 gives NaN, as torch's does
// without epsilon), then its projection is removed from every later column. torch switches to
// LAPACK's QR for ranks above 2; both span the same columns, so P P^T M agrees up to rounding.
#ifndef BRAID_SCHEDULER_HOOKS_LOW_RANK_H_
#define BRAID_SCHEDULER_HOOKS_LOW_RANK_H_

#include <cstddef>

namespace braid::sched {

void MatMul(const float* m, const float* q, float* p, size_t n, size_t k, int r);
void MatTMul(const float* m, const float* p, float* q, size_t n, size_t k, int r);
void LowRankProduct(const float* p, const float* q, float* out, size_t n, size_t k, int r);
void OrthogonalizeColumns(float* a, size_t rows, int cols, float epsilon);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_HOOKS_LOW_RANK_H_
