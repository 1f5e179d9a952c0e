// Memory bandwidth of the fused CUDA AdamW step (optim/adamw_cuda.h) against its baseline: a
// device-to-device cudaMemcpy moving the same number of bytes, timed in the same run.
//
// AdamW moves 28 bytes per parameter in fp32 (p, m, v read and written: 24; f32 grad read: 4),
// and also 28 with bf16 gradients and a bf16 param_out (24 + 2 + 2). A copy of B bytes moves 2B
// (read + write), so the baseline copies bytes_moved / 2; both columns count read + write bytes,
// and `ratio` (kernel / memcpy) says how close the step is to what the memory can do.
//
//   tools/bazelw run //bench:adamw_cuda_bench -- --iters=20 --warmup=5   # n = 10M and 100M
//   tools/bazelw run //bench:adamw_cuda_bench -- --n=1000000              # one size
//
// Without a GPU it prints "no CUDA device: skipped" and exits 0.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/bench_flags.h"
#include "bench/cuda_timing.h"
#include "optim/adamw_cuda.h"
#include "optim/adamw_math.h"
#include "optim/cuda_owners.h"

namespace braid::optim {
namespace {

constexpr int kNoOut = -1;

using bench::KernelVsCopy;
using bench::TimeAgainstCopy;

struct Config {
  const char* name;
  int grad_dtype;
  int out_dtype;  // kNoOut: param_out not written
};

size_t DTypeBytes(int dtype) { return dtype == kCudaDTypeF32 ? 4 : 2; }

// p, m, v read and written, the gradient read, param_out written.
size_t BytesPerParam(const Config& c) {
  return 24 + DTypeBytes(c.grad_dtype) + (c.out_dtype == kNoOut ? 0 : DTypeBytes(c.out_dtype));
}

cudaError_t Measure(const Config& c, size_t n, int warmup, int iters, KernelVsCopy* row) {
  const size_t bytes = n * BytesPerParam(c);
  DeviceBuffer p, m, v, g, out;
  cudaError_t e = p.Allocate(4 * n, 0x3c);
  if (e == cudaSuccess) e = m.Allocate(4 * n, 0x3c);
  if (e == cudaSuccess) e = v.Allocate(4 * n, 0x3c);
  if (e == cudaSuccess) e = g.Allocate(DTypeBytes(c.grad_dtype) * n, 0x3c);
  if (e == cudaSuccess && c.out_dtype != kNoOut) e = out.Allocate(DTypeBytes(c.out_dtype) * n, 0);
  if (e != cudaSuccess) return e;

  AdamWHyper hyper;
  const AdamWScalars s = StepScalars(hyper, 1);
  const auto step = [&] {
    return static_cast<cudaError_t>(AdamWCudaLaunch(
        s, p.f32(), m.f32(), v.f32(), g.get(), c.grad_dtype, n, out.get(), c.out_dtype, nullptr));
  };
  return TimeAgainstCopy(step, bytes, warmup, iters, row);
}

constexpr char kUsage[] =
    R"(adamw_cuda_bench: memory bandwidth of the fused CUDA AdamW step (GB/s at 28 B per
parameter) against a device-to-device cudaMemcpy of the same bytes, in the same run.

usage: adamw_cuda_bench [--iters=N] [--warmup=N] [--n=ELEMENTS]
  --iters=20    timed iterations per size (>= 1)
  --warmup=5    untimed iterations first (>= 0)
  --n=0         elements (0: the sizes 10M and 100M)
Without a GPU it prints "no CUDA device: skipped" and exits 0.
)";

int Run(int argc, char** argv) {
  absl::StatusOr<bench::Flags> flags = bench::Flags::Parse(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", flags.status().ToString().c_str());
    return 2;
  }
  if (bench::PrintHelp(*flags, kUsage)) return 0;
  const absl::StatusOr<bench::KernelBenchFlags> k = bench::ParseKernelBenchFlags(*flags);
  if (!k.ok()) {
    std::fprintf(stderr, "%s\n", k.status().ToString().c_str());
    return 2;
  }
  if (const int code = bench::SkipUnlessCudaDevice(); code >= 0) return code;

  const Config configs[] = {
      {"f32 grad, no param_out", kCudaDTypeF32, kNoOut},
      {"bf16 grad, bf16 param_out", kCudaDTypeBF16, kCudaDTypeBF16},
  };
  std::printf(
      "fused AdamW vs device-to-device cudaMemcpy of the same bytes moved (read + write);"
      " GB/s = 1e9 B/s; iters %lld after %lld warmup\n",
      static_cast<long long>(k->iters), static_cast<long long>(k->warmup));
  std::printf("%12s  %-28s %8s %10s %12s %12s %7s\n", "n", "config", "B/param", "adamw_ms",
              "adamw_GB/s", "memcpy_GB/s", "ratio");
  for (const size_t n : k->sizes) {
    for (const Config& c : configs) {
      KernelVsCopy row;
      const cudaError_t e = Measure(c, n, k->warmup, k->iters, &row);
      if (e != cudaSuccess) {
        std::fprintf(stderr, "n=%zu %s: %s (%d)\n", n, c.name, cudaGetErrorString(e),
                     static_cast<int>(e));
        return 1;
      }
      std::printf("%12zu  %-28s %8zu %10.3f %12.1f %12.1f %7.3f\n", n, c.name, BytesPerParam(c),
                  row.kernel_ms, row.kernel_gbps, row.memcpy_gbps,
                  row.kernel_gbps / row.memcpy_gbps);
    }
  }
  return 0;
}

}  // namespace
}  // namespace braid::optim

int main(int argc, char** argv) { return braid::optim::Run(argc, argv); }
