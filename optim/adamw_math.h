// The optimizer update rules, one element at a time: the definition every kernel (vectorized
// CPU, multi-threaded CPU, CUDA) must reproduce bit for bit, and the serial reference the tests
// compare against.
//
// Bit-exactness: every kernel evaluates exactly these f32 operations in exactly this order,
// with no fused multiply-add (the build passes -ffp-contract=off; nvcc gets --fmad=false) and
// correctly rounded sqrt and division. Per-step scalars are computed once, on the host, in
// double and rounded to float (StepScalars), so no kernel recomputes them differently.
//
// AdamW (decoupled weight decay, as torch.optim.AdamW with amsgrad=False, maximize=False):
//   g  = grad * grad_scale                  (grad_scale: clipping and/or loss-scale unscale)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * (g * g)
//   p  = p * decay                          (decay = 1 - lr * weight_decay)
//   p  = p - step_size * (m / (sqrt(v) * inv_sqrt_bc2 + eps))
// with step_size = lr / (1 - beta1^t) and inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t), t = 1, 2, ...
//
// SGD with momentum (torch.optim.SGD, dampening 0):
//   d = grad * grad_scale + weight_decay * p
//   buf = first step ? d : momentum * buf + d
//   d = nesterov ? d + momentum * buf : buf          (momentum == 0: d as is, no buffer)
//   p = p - lr * d
#ifndef BRAID_OPTIM_ADAMW_MATH_H_
#define BRAID_OPTIM_ADAMW_MATH_H_

#include <cmath>
#include <cstdint>

namespace braid::optim {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// Per-step constants, rounded to float once.
struct AdamWScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float decay;         // 1 - lr * weight_decay
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float grad_scale;  // 1 unless clipping / unscaling
};

// `step` is t >= 1 (the number of this update).
inline AdamWScalars StepScalars(const AdamWHyper& h, int64_t step, double grad_scale = 1.0) {
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(h.beta1, t);
  const double bc2 = 1.0 - std::pow(h.beta2, t);
  AdamWScalars s;
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  s.step_size = static_cast<float>(h.lr / bc1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.eps = static_cast<float>(h.eps);
  s.grad_scale = static_cast<float>(grad_scale);
  return s;
}

// One element of AdamW. `g` is the gradient already widened to f32.
inline void AdamWElement(const AdamWScalars& s, float g, float* p, float* m, float* v) {
  g = g * s.grad_scale;
  const float mm = s.beta1 * *m + s.one_minus_beta1 * g;
  const float vv = s.beta2 * *v + s.one_minus_beta2 * (g * g);
  const float denom = std::sqrt(vv) * s.inv_sqrt_bc2 + s.eps;
  const float pp = *p * s.decay;
  *p = pp - s.step_size * (mm / denom);
  *m = mm;
  *v = vv;
}

struct SgdHyper {
  double lr = 1e-2;
  double momentum = 0.9;
  double weight_decay = 0.0;
  bool nesterov = false;
};

struct SgdScalars {
  float lr, momentum, weight_decay, grad_scale;
  bool nesterov;
  bool first;  // first step: the momentum buffer starts as d
};

inline SgdScalars SgdStepScalars(const SgdHyper& h, int64_t step, double grad_scale = 1.0) {
  return SgdScalars{static_cast<float>(h.lr),
                    static_cast<float>(h.momentum),
                    static_cast<float>(h.weight_decay),
                    static_cast<float>(grad_scale),
                    h.nesterov,
                    step == 1};
}

// One element of SGD; `buf` is unused when momentum == 0.
inline void SgdElement(const SgdScalars& s, float g, float* p, float* buf) {
  float d = g * s.grad_scale + s.weight_decay * *p;
  if (s.momentum != 0.0f) {
    const float b = s.first ? d : s.momentum * *buf + d;
    *buf = b;
    d = s.nesterov ? d + s.momentum * b : b;
  }
  *p = *p - s.lr * d;
}

}  // namespace braid::optim

#endif  // BRAID_OPTIM_ADAMW_MATH_H_
