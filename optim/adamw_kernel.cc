#include "optim/adamw_kernel.h"

#include <cstdint>
#include <type_traits>

#include "optim/kernel_convert.h"

namespace braid::optim {
namespace {

using internal::NoOut;
using internal::Widen;

template <typename O>
void StoreOut(O* out, size_t i, float x) {
  if constexpr (!std::is_same_v<O, NoOut>) internal::Narrow(out + i, x);
}

// Elements [i, n) one at a time: the scalar path, and the tail of the vector path.
template <typename G, typename O>
void AdamWTail(const AdamWScalars& s, float* p, float* m, float* v, const G* g, O* out, size_t i,
               size_t n) {
  for (; i < n; ++i) {
    AdamWElement(s, Widen(g[i]), p + i, m + i, v + i);
    StoreOut(out, i, p[i]);
  }
}

template <typename G, typename O>
void SgdTail(const SgdScalars& s, float* p, float* buf, const G* g, O* out, size_t i, size_t n) {
  for (; i < n; ++i) {
    SgdElement(s, Widen(g[i]), p + i, buf == nullptr ? nullptr : buf + i);
    StoreOut(out, i, p[i]);
  }
}

#if defined(BRAID_OPTIM_AVX2)

// Software prefetch this many elements ahead, once per 16 elements (a 64-byte line of f32), on
// every input stream. The hardware prefetcher alone left ~10% of the streaming bandwidth unused
// with seven concurrent streams (measured: bench/adamw_bench, docs/performance.md); the hint
// cannot fault, and the address is formed as an integer so no pointer leaves its array.
constexpr size_t kPrefetchAhead = 1024;

template <typename T>
void PrefetchAhead(const T* base, size_t i) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(base) + (i + kPrefetchAhead) * sizeof(T);
  _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
}

// AdamWElement on eight lanes: the same operations in the same order (the build has
// -ffp-contract=off, so no multiply-add is fused; vsqrtps and vdivps are correctly rounded).
template <typename G, typename O>
void AdamWVector(const AdamWScalars& s, float* p, float* m, float* v, const G* g, O* out,
                 size_t n) {
  const __m256 grad_scale = _mm256_set1_ps(s.grad_scale);
  const __m256 beta1 = _mm256_set1_ps(s.beta1), one_minus_beta1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2), one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 decay = _mm256_set1_ps(s.decay), step_size = _mm256_set1_ps(s.step_size);
  const __m256 inv_sqrt_bc2 = _mm256_set1_ps(s.inv_sqrt_bc2), eps = _mm256_set1_ps(s.eps);
  auto step8 = [&](size_t i) {
    const __m256 gg = _mm256_mul_ps(internal::Load8(g + i), grad_scale);
    const __m256 mm = _mm256_add_ps(_mm256_mul_ps(beta1, _mm256_loadu_ps(m + i)),
                                    _mm256_mul_ps(one_minus_beta1, gg));
    const __m256 vv = _mm256_add_ps(_mm256_mul_ps(beta2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(one_minus_beta2, _mm256_mul_ps(gg, gg)));
    const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vv), inv_sqrt_bc2), eps);
    const __m256 pp = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 np = _mm256_sub_ps(pp, _mm256_mul_ps(step_size, _mm256_div_ps(mm, denom)));
    _mm256_storeu_ps(p + i, np);
    _mm256_storeu_ps(m + i, mm);
    _mm256_storeu_ps(v + i, vv);
    if constexpr (!std::is_same_v<O, NoOut>) internal::Store8(out + i, np);
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    PrefetchAhead(p, i);
    PrefetchAhead(m, i);
    PrefetchAhead(v, i);
    PrefetchAhead(g, i);
    step8(i);
    step8(i + 8);
  }
  if (i + 8 <= n) {
    step8(i);
    i += 8;
  }
  AdamWTail(s, p, m, v, g, out, i, n);
}

// SgdElement on eight lanes. The branches are per call, so they predict perfectly.
template <typename G, typename O>
void SgdVector(const SgdScalars& s, float* p, float* buf, const G* g, O* out, size_t n) {
  const __m256 grad_scale = _mm256_set1_ps(s.grad_scale), wd = _mm256_set1_ps(s.weight_decay);
  const __m256 momentum = _mm256_set1_ps(s.momentum), lr = _mm256_set1_ps(s.lr);
  const bool use_buf = s.momentum != 0.0f;
  auto step8 = [&](size_t i) {
    const __m256 pv = _mm256_loadu_ps(p + i);
    __m256 d =
        _mm256_add_ps(_mm256_mul_ps(internal::Load8(g + i), grad_scale), _mm256_mul_ps(wd, pv));
    if (use_buf) {
      const __m256 b =
          s.first ? d : _mm256_add_ps(_mm256_mul_ps(momentum, _mm256_loadu_ps(buf + i)), d);
      _mm256_storeu_ps(buf + i, b);
      d = s.nesterov ? _mm256_add_ps(d, _mm256_mul_ps(momentum, b)) : b;
    }
    const __m256 np = _mm256_sub_ps(pv, _mm256_mul_ps(lr, d));
    _mm256_storeu_ps(p + i, np);
    if constexpr (!std::is_same_v<O, NoOut>) internal::Store8(out + i, np);
  };
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    PrefetchAhead(p, i);
    if (use_buf) PrefetchAhead(buf, i);
    PrefetchAhead(g, i);
    step8(i);
    step8(i + 8);
  }
  if (i + 8 <= n) {
    step8(i);
    i += 8;
  }
  SgdTail(s, p, buf, g, out, i, n);
}

#endif  // BRAID_OPTIM_AVX2

// Resolves the storage types, then runs the vector path (if `vector` and built) or the scalar.
void AdamWDispatch(bool vector, const AdamWScalars& s, float* p, float* m, float* v,
                   const void* grad, DType grad_dtype, size_t n, void* param_out, DType out_dtype) {
  internal::WithGradType(grad_dtype, [&](auto gt) {
    using G = decltype(gt);
    internal::WithOutType(param_out, out_dtype, [&](auto ot) {
      using O = decltype(ot);
      const G* g = static_cast<const G*>(grad);
      O* out = static_cast<O*>(param_out);
#if defined(BRAID_OPTIM_AVX2)
      if (vector) return AdamWVector(s, p, m, v, g, out, n);
#else
      static_cast<void>(vector);  // no vector path in this build
#endif
      AdamWTail(s, p, m, v, g, out, 0, n);
    });
  });
}

void SgdDispatch(bool vector, const SgdScalars& s, float* p, float* buf, const void* grad,
                 DType grad_dtype, size_t n, void* param_out, DType out_dtype) {
  BRAID_CHECK(s.momentum == 0.0f || buf != nullptr || n == 0);
  internal::WithGradType(grad_dtype, [&](auto gt) {
    using G = decltype(gt);
    internal::WithOutType(param_out, out_dtype, [&](auto ot) {
      using O = decltype(ot);
      const G* g = static_cast<const G*>(grad);
      O* out = static_cast<O*>(param_out);
#if defined(BRAID_OPTIM_AVX2)
      if (vector) return SgdVector(s, p, buf, g, out, n);
#else
      static_cast<void>(vector);  // no vector path in this build
#endif
      SgdTail(s, p, buf, g, out, 0, n);
    });
  });
}

// Byte offset of element `lo` in an array of `t` (nullptr stays nullptr).
template <typename T>
T* Advance(T* base, size_t lo, DType t) {
  if (base == nullptr) return nullptr;
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return static_cast<Byte*>(base) + lo * DTypeSize(t);
}

}  // namespace

void AdamWRange(const AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                DType grad_dtype, size_t n, void* param_out, DType out_dtype) {
  AdamWDispatch(/*vector=*/true, s, p, m, v, grad, grad_dtype, n, param_out, out_dtype);
}

void AdamWRangeScalar(const AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                      DType grad_dtype, size_t n, void* param_out, DType out_dtype) {
  AdamWDispatch(/*vector=*/false, s, p, m, v, grad, grad_dtype, n, param_out, out_dtype);
}

void SgdRange(const SgdScalars& s, float* p, float* buf, const void* grad, DType grad_dtype,
              size_t n, void* param_out, DType out_dtype) {
  SgdDispatch(/*vector=*/true, s, p, buf, grad, grad_dtype, n, param_out, out_dtype);
}

void SgdRangeScalar(const SgdScalars& s, float* p, float* buf, const void* grad, DType grad_dtype,
                    size_t n, void* param_out, DType out_dtype) {
  SgdDispatch(/*vector=*/false, s, p, buf, grad, grad_dtype, n, param_out, out_dtype);
}

void AdamWParallel(KernelPool& pool, const AdamWScalars& s, float* p, float* m, float* v,
                   const void* grad, DType grad_dtype, size_t n, void* param_out, DType out_dtype,
                   size_t grain) {
  pool.ParallelFor(n, grain, [&](size_t lo, size_t hi) {
    AdamWRange(s, p + lo, m + lo, v + lo, Advance(grad, lo, grad_dtype), grad_dtype, hi - lo,
               Advance(param_out, lo, out_dtype), out_dtype);
  });
}

void SgdParallel(KernelPool& pool, const SgdScalars& s, float* p, float* buf, const void* grad,
                 DType grad_dtype, size_t n, void* param_out, DType out_dtype, size_t grain) {
  pool.ParallelFor(n, grain, [&](size_t lo, size_t hi) {
    SgdRange(s, p + lo, buf == nullptr ? nullptr : buf + lo, Advance(grad, lo, grad_dtype),
             grad_dtype, hi - lo, Advance(param_out, lo, out_dtype), out_dtype);
  });
}

}  // namespace braid::optim
