// Memory bandwidth of the bucket kernels (backends/nccl/kernels/bucket_kernels.h: pack of many
// gradients into a bucket with the divide factor fused, unpack, the reduce-dtype casts, the f16
// post-divide and the partial-sum add)
// against their baseline: a device-to-device cudaMemcpy moving the same number of bytes, timed
// in the same run. Bytes moved = bytes read + bytes written (a copy of B bytes moves 2B, so the
// baseline copies bytes_moved / 2); `ratio` = kernel GB/s / memcpy GB/s (issue target >= 0.8).
//
//   tools/bazelw run //bench:bucket_kernels_cuda_bench                  # n = 10M and 100M
//   tools/bazelw run //bench:bucket_kernels_cuda_bench -- --n=25000000 --segments=200
//
// Without a GPU it prints "no CUDA device: skipped" and exits 0.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/nccl/kernels/bucket_kernels.h"
#include "bench/bench_flags.h"
#include "bench/cuda_timing.h"
#include "optim/cuda_owners.h"

namespace braid::bench {
namespace {

using nccl::kernels::BucketSegment;
using optim::DeviceBuffer;

enum class Kind { kPack, kUnpack, kCast, kPostDivide, kAdd };

struct Config {
  const char* name;
  Kind kind;
  int grad_dtype;    // pack / unpack: the gradients' dtype; cast: the source dtype
  int bucket_dtype;  // pack / unpack: the bucket's dtype; cast: the destination dtype
};

size_t DTypeBytes(int dtype) { return dtype == nccl::kernels::kF32 ? 4 : 2; }

size_t BytesMoved(const Config& c, size_t n) {
  // add: reads a and b, writes dst (all of grad_dtype).
  if (c.kind == Kind::kAdd) return 3 * n * DTypeBytes(c.grad_dtype);
  return n * (DTypeBytes(c.grad_dtype) + DTypeBytes(c.bucket_dtype));
}

cudaError_t Measure(const Config& c, size_t n, int segments, int warmup, int iters,
                    KernelVsCopy* row) {
  DeviceBuffer grads, bucket;
  cudaError_t e = grads.Allocate(DTypeBytes(c.grad_dtype) * n, 0x3c);
  if (e == cudaSuccess) e = bucket.Allocate(DTypeBytes(c.bucket_dtype) * n, 0x3c);
  if (e != cudaSuccess) return e;
  // `segments` gradients of (almost) equal size laid end to end, as a bucket of that many
  // parameters.
  std::vector<BucketSegment> segs;
  const size_t per = n / segments;
  for (int i = 0; i < segments; ++i) {
    const size_t off = per * i;
    const size_t count = i + 1 == segments ? n - off : per;
    segs.push_back(
        BucketSegment{grads.get() + off * DTypeBytes(c.grad_dtype), off, count, c.grad_dtype});
  }
  const auto kernel = [&] {
    switch (c.kind) {
      case Kind::kPack:
        return static_cast<cudaError_t>(nccl::kernels::BucketPackLaunch(
            segs.data(), segments, bucket.get(), c.bucket_dtype, n, 0.5f, nullptr));
      case Kind::kUnpack:
        return static_cast<cudaError_t>(nccl::kernels::BucketUnpackLaunch(
            segs.data(), segments, bucket.get(), c.bucket_dtype, n, 0.5f, nullptr));
      case Kind::kPostDivide:  // the f16 native post-divide: in place, divide by 2
        return static_cast<cudaError_t>(nccl::kernels::CastScaleLaunch(
            bucket.get(), c.bucket_dtype, bucket.get(), c.bucket_dtype, n,
            nccl::kernels::ScaleArgs{0, 1.0f, 2}, nullptr));
      case Kind::kAdd:  // reduce_scatter_only's partial sums: bucket += grads
        return static_cast<cudaError_t>(nccl::kernels::AddLaunch(
            bucket.get(), grads.get(), bucket.get(), n, c.grad_dtype, nullptr));
      case Kind::kCast:
        break;
    }
    return static_cast<cudaError_t>(
        nccl::kernels::CastScaleLaunch(grads.get(), c.grad_dtype, bucket.get(), c.bucket_dtype, n,
                                       nccl::kernels::ScaleArgs{}, nullptr));
  };
  return TimeAgainstCopy(kernel, BytesMoved(c, n), warmup, iters, row);
}

constexpr char kUsage[] =
    R"(bucket_kernels_cuda_bench: memory bandwidth of the bucket kernels (pack with the
divide fused, unpack, reduce-dtype casts, f16 post-divide, partial-sum add) against a
device-to-device cudaMemcpy of the same bytes, in the same run.

usage: bucket_kernels_cuda_bench [--segments=N] [--iters=N] [--warmup=N] [--n=ELEMENTS]
  --segments=64 gradients packed into one bucket (>= 1)
  --iters=20    timed iterations per size (>= 1)
  --warmup=5    untimed iterations first (>= 0)
  --n=0         elements (0: the sizes 10M and 100M)
Without a GPU it prints "no CUDA device: skipped" and exits 0.
)";

int Run(int argc, char** argv) {
  absl::StatusOr<Flags> flags = Flags::Parse(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "%s\n", flags.status().ToString().c_str());
    return 2;
  }
  if (PrintHelp(*flags, kUsage)) return 0;
  const absl::StatusOr<int64_t> segments = flags->Int("segments", 64);
  const absl::StatusOr<KernelBenchFlags> k = ParseKernelBenchFlags(*flags);
  absl::Status bad = segments.status();
  if (bad.ok()) bad = k.status();
  if (bad.ok() && *segments < 1) bad = absl::InvalidArgumentError("--segments must be >= 1");
  if (!bad.ok()) {
    std::fprintf(stderr, "%s\n", bad.ToString().c_str());
    return 2;
  }
  if (const int code = SkipUnlessCudaDevice(); code >= 0) return code;

  using nccl::kernels::kBF16;
  using nccl::kernels::kF16;
  using nccl::kernels::kF32;
  const Config configs[] = {
      {"pack f32 -> f32 bucket", Kind::kPack, kF32, kF32},
      {"pack bf16 -> f32 bucket", Kind::kPack, kBF16, kF32},
      {"pack bf16 -> bf16 bucket", Kind::kPack, kBF16, kBF16},
      {"unpack f32 bucket -> f32", Kind::kUnpack, kF32, kF32},
      {"unpack f32 bucket -> bf16", Kind::kUnpack, kBF16, kF32},
      {"cast bf16 -> f32", Kind::kCast, kBF16, kF32},
      {"cast f32 -> bf16", Kind::kCast, kF32, kBF16},
      {"post-divide f16 (in place)", Kind::kPostDivide, kF16, kF16},
      {"add f32 (in place)", Kind::kAdd, kF32, kF32},
      {"add bf16 (in place)", Kind::kAdd, kBF16, kBF16},
  };
  std::printf(
      "bucket kernels vs device-to-device cudaMemcpy of the same bytes moved (read + write);"
      " GB/s = 1e9 B/s; %lld segments; iters %lld after %lld warmup\n",
      static_cast<long long>(*segments), static_cast<long long>(k->iters),
      static_cast<long long>(k->warmup));
  std::printf("%12s  %-28s %10s %12s %12s %7s\n", "n", "kernel", "ms", "kernel_GB/s", "memcpy_GB/s",
              "ratio");
  for (const size_t n : k->sizes) {
    for (const Config& c : configs) {
      KernelVsCopy row;
      const cudaError_t e = Measure(c, n, static_cast<int>(*segments), k->warmup, k->iters, &row);
      if (e != cudaSuccess) {
        std::fprintf(stderr, "n=%zu %s: %s (%d)\n", n, c.name, cudaGetErrorString(e),
                     static_cast<int>(e));
        return 1;
      }
      std::printf("%12zu  %-28s %10.3f %12.1f %12.1f %7.3f\n", n, c.name, row.kernel_ms,
                  row.kernel_gbps, row.memcpy_gbps, row.kernel_gbps / row.memcpy_gbps);
    }
  }
  return 0;
}

}  // namespace
}  // namespace braid::bench

int main(int argc, char** argv) { return braid::bench::Run(argc, argv); }
