// Fused AdamW / SGD CUDA kernels (see adamw_cuda.h for the contract).
//
// Built by the nvcc genrule in optim/BUILD.bazel with --fmad=false -prec-div=true
// -prec-sqrt=true -ftz=false: no contraction into FMA, IEEE division and sqrt, subnormals kept.
// The element functions below additionally spell every rounding with an __f*_rn intrinsic,
// which CUDA never fuses into an FMA, so their results do not hinge on those flags.
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "optim/adamw_cuda.h"
#include "optim/norm_math.h"

namespace braid::optim {
namespace {

constexpr int kThreads = 256;

// ---- The update rules, on device ---------------------------------------------------------

// Device copy of AdamWElement in optim/adamw_math.h: the same f32 operations in the same
// order. Keep the two in step: the tests compare them bit for bit.
__device__ __forceinline__ void AdamWElementDevice(const AdamWScalars& s, float g, float* p,
                                                   float* m, float* v) {
  g = __fmul_rn(g, s.grad_scale);
  const float mm = __fadd_rn(__fmul_rn(s.beta1, *m), __fmul_rn(s.one_minus_beta1, g));
  const float vv = __fadd_rn(__fmul_rn(s.beta2, *v), __fmul_rn(s.one_minus_beta2, __fmul_rn(g, g)));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(vv), s.inv_sqrt_bc2), s.eps);
  const float pp = __fmul_rn(*p, s.decay);
  *p = __fsub_rn(pp, __fmul_rn(s.step_size, __fdiv_rn(mm, denom)));
  *m = mm;
  *v = vv;
}

// Device copy of SgdElement in optim/adamw_math.h (same order, same roundings).
__device__ __forceinline__ void SgdElementDevice(const SgdScalars& s, float g, float* p,
                                                 float* buf) {
  float d = __fadd_rn(__fmul_rn(g, s.grad_scale), __fmul_rn(s.weight_decay, *p));
  if (s.momentum != 0.0f) {
    const float b = s.first ? d : __fadd_rn(__fmul_rn(s.momentum, *buf), d);
    *buf = b;
    d = s.nesterov ? __fadd_rn(d, __fmul_rn(s.momentum, b)) : b;
  }
  *p = __fsub_rn(*p, __fmul_rn(s.lr, d));
}

// ---- 16-bit storage: device copies of comm/half.h ------------------------------------------

struct Bf16 {
  uint16_t bits;
  // ToFloat(BF16) in comm/half.h.
  static __device__ __forceinline__ float Widen(uint32_t h) { return __uint_as_float(h << 16); }
  // ToBF16 in comm/half.h: NaN stays a quiet NaN after truncation; otherwise nearest even.
  static __device__ __forceinline__ uint32_t Narrow(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 0x40u) & 0xffffu;
    u += 0x7fffu + ((u >> 16) & 1u);
    return u >> 16;
  }
};

struct Half {
  uint16_t bits;
  // ToFloat(F16) in comm/half.h (exact for every input, NaN payloads included).
  static __device__ __forceinline__ float Widen(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return __uint_as_float(sign | ((exp + 112u) << 23) | (man << 13));
    const float mag = __fmul_rn(__uint2float_rn(man), 5.9604644775390625e-8f);  // exact
    return sign ? -mag : mag;
  }
  // ToF16 in comm/half.h: round to nearest even, overflow to inf, subnormals via a float add.
  static __device__ __forceinline__ uint32_t Narrow(float f) {
    const uint32_t u = __float_as_uint(f);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return sign | 0x7e00u;
    if (abs >= 0x477ff000u) return sign | 0x7c00u;
    if (abs < 0x38800000u) {
      const float scaled = __fadd_rn(__uint_as_float(abs), 0.5f);
      return (sign | (__float_as_uint(scaled) - 0x3f000000u)) & 0xffffu;
    }
    const uint32_t v = abs + 0xc8000fffu + ((abs >> 13) & 1u);
    return (sign | (v >> 13)) & 0xffffu;
  }
};

struct NoOut {};  // param_out not requested: stores compile away

// Loads and stores of one element or of a 4-element group starting at index i. The group
// forms assume the alignment Plan() established (16 bytes for f32, 8 for 16-bit types).
template <typename T>
struct Io;

template <>
struct Io<float> {
  static __device__ __forceinline__ float Load(const float* a, size_t i) { return a[i]; }
  static __device__ __forceinline__ float4 Load4(const float* a, size_t i) {
    return *reinterpret_cast<const float4*>(a + i);
  }
  static __device__ __forceinline__ void Store(float* a, size_t i, float x) { a[i] = x; }
  static __device__ __forceinline__ void Store4(float* a, size_t i, float4 x) {
    *reinterpret_cast<float4*>(a + i) = x;
  }
};

template <typename H>
struct Io16 {
  static __device__ __forceinline__ float Load(const H* a, size_t i) { return H::Widen(a[i].bits); }
  static __device__ __forceinline__ float4 Load4(const H* a, size_t i) {
    const uint2 w = *reinterpret_cast<const uint2*>(a + i);  // little-endian: low half first
    return make_float4(H::Widen(w.x & 0xffffu), H::Widen(w.x >> 16), H::Widen(w.y & 0xffffu),
                       H::Widen(w.y >> 16));
  }
  static __device__ __forceinline__ void Store(H* a, size_t i, float x) {
    a[i].bits = static_cast<uint16_t>(H::Narrow(x));
  }
  static __device__ __forceinline__ void Store4(H* a, size_t i, float4 x) {
    uint2 w;
    w.x = H::Narrow(x.x) | (H::Narrow(x.y) << 16);
    w.y = H::Narrow(x.z) | (H::Narrow(x.w) << 16);
    *reinterpret_cast<uint2*>(a + i) = w;
  }
};
template <>
struct Io<Bf16> : Io16<Bf16> {};
template <>
struct Io<Half> : Io16<Half> {};

template <>
struct Io<NoOut> {
  static __device__ __forceinline__ void Store(NoOut*, size_t, float) {}
  static __device__ __forceinline__ void Store4(NoOut*, size_t, float4) {}
};

// ---- Rules: the optimizer state each one reads and writes ----------------------------------

struct AdamWRule {
  AdamWScalars s;
  float* m;
  float* v;
  __device__ __forceinline__ float Step(size_t i, float g, float p) const {
    float mi = m[i], vi = v[i];
    AdamWElementDevice(s, g, &p, &mi, &vi);
    m[i] = mi;
    v[i] = vi;
    return p;
  }
  __device__ __forceinline__ float4 Step4(size_t i, float4 g, float4 p) const {
    float4 mm = Io<float>::Load4(m, i), vv = Io<float>::Load4(v, i);
    AdamWElementDevice(s, g.x, &p.x, &mm.x, &vv.x);
    AdamWElementDevice(s, g.y, &p.y, &mm.y, &vv.y);
    AdamWElementDevice(s, g.z, &p.z, &mm.z, &vv.z);
    AdamWElementDevice(s, g.w, &p.w, &mm.w, &vv.w);
    Io<float>::Store4(m, i, mm);
    Io<float>::Store4(v, i, vv);
    return p;
  }
};

struct SgdRule {
  SgdScalars s;
  float* buf;  // null when s.momentum == 0: SgdElementDevice then never touches it
  __device__ __forceinline__ float Step(size_t i, float g, float p) const {
    float b = 0.0f;
    if (s.momentum != 0.0f) b = buf[i];
    SgdElementDevice(s, g, &p, &b);
    if (s.momentum != 0.0f) buf[i] = b;
    return p;
  }
  __device__ __forceinline__ float4 Step4(size_t i, float4 g, float4 p) const {
    float4 b = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (s.momentum != 0.0f) b = Io<float>::Load4(buf, i);
    SgdElementDevice(s, g.x, &p.x, &b.x);
    SgdElementDevice(s, g.y, &p.y, &b.y);
    SgdElementDevice(s, g.z, &p.z, &b.z);
    SgdElementDevice(s, g.w, &p.w, &b.w);
    if (s.momentum != 0.0f) Io<float>::Store4(buf, i, b);
    return p;
  }
};

// How [0, n) splits: a scalar head [0, head), a body of n_vec 4-element groups that are
// aligned in every buffer, and a scalar tail. Without a common alignment, head == n.
struct Span {
  size_t head = 0;
  size_t n_vec = 0;
  size_t n = 0;
};

// One pass over [0, n): grid-stride over the aligned body, then the (short) head and tail.
template <typename Rule, typename G, typename O>
__global__ void __launch_bounds__(kThreads)
    FusedStepKernel(Rule rule, float* __restrict__ p, const G* __restrict__ g, O* __restrict__ out,
                    Span span) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t k = tid; k < span.n_vec; k += stride) {
    const size_t i = span.head + 4 * k;
    const float4 pv = rule.Step4(i, Io<G>::Load4(g, i), Io<float>::Load4(p, i));
    Io<float>::Store4(p, i, pv);
    Io<O>::Store4(out, i, pv);
  }
  for (size_t i = tid; i < span.head; i += stride) {
    const float pv = rule.Step(i, Io<G>::Load(g, i), p[i]);
    p[i] = pv;
    Io<O>::Store(out, i, pv);
  }
  for (size_t i = span.head + 4 * span.n_vec + tid; i < span.n; i += stride) {
    const float pv = rule.Step(i, Io<G>::Load(g, i), p[i]);
    p[i] = pv;
    Io<O>::Store(out, i, pv);
  }
}

// ---- Squared-norm block sums (optim/norm_math.h) --------------------------------------------

// One thread per lane of a norm block: kNormLanes consecutive threads own one block, lane k
// adding elements k, k + 16, ... of it in increasing order (NormBlockSum's lane rule; a read of
// 16 consecutive elements per step), then the block's first thread forms the lane tree.
constexpr int kNormBlocksPerCta = kThreads / static_cast<int>(kNormLanes);

template <typename G>
__global__ void __launch_bounds__(kThreads)
    NormBlockSumsKernel(const G* __restrict__ g, size_t n, double* __restrict__ sums) {
  __shared__ double lanes[kThreads];
  const size_t blocks = NormBlocks(n);
  const unsigned lane = threadIdx.x % kNormLanes;
  const size_t block =
      static_cast<size_t>(blockIdx.x) * kNormBlocksPerCta + threadIdx.x / kNormLanes;
  double acc = 0.0;
  if (block < blocks) {
    const size_t lo = block * kNormBlock;
    const size_t len = n - lo < kNormBlock ? n - lo : kNormBlock;
    for (size_t i = lane; i < len; i += kNormLanes) acc += NormSquare(Io<G>::Load(g, lo + i));
  }
  lanes[threadIdx.x] = acc;
  __syncthreads();
  if (lane == 0 && block < blocks) sums[block] = NormLaneTree(&lanes[threadIdx.x]);
}

// Before a launch: the stream's device made current (a launch into a stream of another device
// fails, and the occupancy query below reads the current device), and the thread's last error
// cleared, so the cudaGetLastError() after the launch reports the launch alone (an earlier
// non-sticky error on this thread, such as a cudaEventQuery "not ready", is no launch failure).
cudaError_t PrepareLaunch(cudaStream_t stream) {
  if (stream != nullptr) {
    int device = 0, current = -1;
    cudaError_t e = cudaStreamGetDevice(stream, &device);
    if (e != cudaSuccess) return e;
    if (cudaGetDevice(&current) != cudaSuccess || current != device) {
      e = cudaSetDevice(device);
      if (e != cudaSuccess) return e;
    }
  }
  (void)cudaGetLastError();
  return cudaSuccess;
}

template <typename G>
int LaunchNorm(const G* g, size_t n, double* sums, cudaStream_t stream) {
  const size_t ctas = (NormBlocks(n) + kNormBlocksPerCta - 1) / kNormBlocksPerCta;
  if (ctas > 0x7fffffffu) return cudaErrorInvalidValue;
  if (const cudaError_t e = PrepareLaunch(stream); e != cudaSuccess) return e;
  NormBlockSumsKernel<G><<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(g, n, sums);
  return cudaGetLastError();
}

// ---- Host side ------------------------------------------------------------------------------

// The f32 state buffers of a rule (null when absent), for Plan().
struct State {
  const float* a;
  const float* b;
};

struct Buffer {
  const void* ptr;
  size_t elem_size;
};

// Where each buffer sits inside its 4-element group; the body is vectorized only when every
// buffer sits at the same place (e.g. all are shards at the same element offset), so that one
// scalar head aligns them all at once.
Span Plan(size_t n, std::initializer_list<Buffer> buffers) {
  Span span;
  span.n = n;
  span.head = n;  // scalar everywhere unless a common phase exists
  int phase = -1;
  for (const Buffer& b : buffers) {
    if (b.ptr == nullptr) continue;  // absent optional buffer
    const auto addr = reinterpret_cast<uintptr_t>(b.ptr);
    if (addr % b.elem_size != 0) return span;
    const int ph = static_cast<int>((addr / b.elem_size) % 4);
    if (phase >= 0 && ph != phase) return span;
    phase = ph;
  }
  const size_t head = static_cast<size_t>((4 - phase) % 4);
  if (head >= n) return span;
  span.head = head;
  span.n_vec = (n - head) / 4;
  return span;
}

template <typename Rule, typename G, typename O>
int Launch(const Rule& rule, const State& state, float* p, const G* g, O* out, size_t n,
           cudaStream_t stream) {
  // Every buffer the kernel touches takes part in the alignment decision (out is null, and
  // skipped, for NoOut).
  const Span span =
      Plan(n, {Buffer{p, sizeof(float)}, Buffer{state.a, sizeof(float)},
               Buffer{state.b, sizeof(float)}, Buffer{g, sizeof(G)}, Buffer{out, sizeof(O)}});
  const auto kernel = FusedStepKernel<Rule, G, O>;
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = PrepareLaunch(stream);
  if (e != cudaSuccess) return e;
  e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return e;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  if (e != cudaSuccess) return e;
  // Enough threads for every body group and the longer of head / tail, capped at one full
  // wave of resident blocks (more would only queue): the grid-stride loops cover the rest.
  const size_t tail = span.n - span.head - 4 * span.n_vec;
  const size_t items = span.n_vec + (span.head > tail ? span.head : tail);
  const size_t wanted = (items + kThreads - 1) / kThreads;
  const size_t cap = static_cast<size_t>(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  const unsigned blocks = static_cast<unsigned>(wanted < cap ? wanted : cap);
  kernel<<<blocks, kThreads, 0, stream>>>(rule, p, g, out, span);
  return cudaGetLastError();
}

template <typename Rule, typename G>
int DispatchOut(const Rule& rule, const State& state, float* p, const G* g, size_t n, void* out,
                int out_dtype, cudaStream_t stream) {
  if (out == nullptr) return Launch(rule, state, p, g, static_cast<NoOut*>(nullptr), n, stream);
  switch (out_dtype) {
    case kCudaDTypeF32:
      return Launch(rule, state, p, g, static_cast<float*>(out), n, stream);
    case kCudaDTypeBF16:
      return Launch(rule, state, p, g, static_cast<Bf16*>(out), n, stream);
    case kCudaDTypeF16:
      return Launch(rule, state, p, g, static_cast<Half*>(out), n, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename Rule>
int Dispatch(const Rule& rule, const State& state, float* p, const void* grad, int grad_dtype,
             size_t n, void* out, int out_dtype, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  switch (grad_dtype) {
    case kCudaDTypeF32:
      return DispatchOut(rule, state, p, static_cast<const float*>(grad), n, out, out_dtype, st);
    case kCudaDTypeBF16:
      return DispatchOut(rule, state, p, static_cast<const Bf16*>(grad), n, out, out_dtype, st);
    case kCudaDTypeF16:
      return DispatchOut(rule, state, p, static_cast<const Half*>(grad), n, out, out_dtype, st);
  }
  return cudaErrorInvalidValue;
}

bool IsKernelDType(int t) {
  return t == kCudaDTypeF32 || t == kCudaDTypeBF16 || t == kCudaDTypeF16;
}

// Argument checks shared by both launchers; they run before any CUDA call so that bad input
// is reported the same way with or without a device.
bool ValidArgs(const void* grad, int grad_dtype, size_t n, const void* out, int out_dtype) {
  if (!IsKernelDType(grad_dtype)) return false;
  if (out != nullptr && !IsKernelDType(out_dtype)) return false;
  return n == 0 || grad != nullptr;
}

}  // namespace

const char* CudaErrorString(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

int AdamWCudaLaunch(const AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                    int grad_dtype, size_t n, void* param_out, int out_dtype, void* stream) {
  if (!ValidArgs(grad, grad_dtype, n, param_out, out_dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (p == nullptr || m == nullptr || v == nullptr) return cudaErrorInvalidValue;
  return Dispatch(AdamWRule{s, m, v}, State{m, v}, p, grad, grad_dtype, n, param_out, out_dtype,
                  stream);
}

int SgdCudaLaunch(const SgdScalars& s, float* p, float* buf, const void* grad, int grad_dtype,
                  size_t n, void* param_out, int out_dtype, void* stream) {
  if (!ValidArgs(grad, grad_dtype, n, param_out, out_dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (p == nullptr || (s.momentum != 0.0f && buf == nullptr)) return cudaErrorInvalidValue;
  float* const used_buf = s.momentum != 0.0f ? buf : nullptr;
  return Dispatch(SgdRule{s, used_buf}, State{used_buf, nullptr}, p, grad, grad_dtype, n, param_out,
                  out_dtype, stream);
}

int NormBlockSumsCudaLaunch(const void* grad, int grad_dtype, size_t n, double* block_sums,
                            void* stream) {
  if (!IsKernelDType(grad_dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (grad == nullptr || block_sums == nullptr) return cudaErrorInvalidValue;
  const auto st = static_cast<cudaStream_t>(stream);
  switch (grad_dtype) {
    case kCudaDTypeF32:
      return LaunchNorm(static_cast<const float*>(grad), n, block_sums, st);
    case kCudaDTypeBF16:
      return LaunchNorm(static_cast<const Bf16*>(grad), n, block_sums, st);
    case kCudaDTypeF16:
      return LaunchNorm(static_cast<const Half*>(grad), n, block_sums, st);
  }
  return cudaErrorInvalidValue;
}

}  // namespace braid::optim
