// See bucket_kernels.h. Built by the genrule in BUILD.bazel with --fmad=false.
#include <cuda_runtime.h>

#include <algorithm>

#include "backends/nccl/kernels/bucket_kernels.h"

namespace braid::nccl::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSegmentsPerLaunch = 64;  // by-value table: 64 * 32 bytes of kernel params
constexpr unsigned kMaxBlocksX = 1024;

struct SegmentTable {
  BucketSegment seg[kMaxSegmentsPerLaunch];
};

// blockIdx.y picks the segment; x blocks stride over its elements.
__global__ void PackKernel(SegmentTable t, void* bucket, int bucket_dtype, float scale) {
  const BucketSegment s = t.seg[blockIdx.y];
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < s.count;
       i += stride) {
    ConvertElement(s.grad, i, s.dtype, bucket, s.offset + i, bucket_dtype, scale);
  }
}

__global__ void UnpackKernel(SegmentTable t, const void* bucket, int bucket_dtype, float scale) {
  const BucketSegment s = t.seg[blockIdx.y];
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < s.count;
       i += stride) {
    ConvertElement(bucket, s.offset + i, bucket_dtype, s.grad, i, s.dtype, scale);
  }
}

__global__ void CastScaleKernel(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                                ScaleArgs scale) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    CastScaleElement(src, i, src_dtype, dst, dst_dtype, scale);
  }
}

__global__ void AddKernel(const void* a, const void* b, void* dst, size_t n, int dtype) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    AddElement(a, b, dst, i, dtype);
  }
}

unsigned BlocksFor(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min<size_t>(b, kMaxBlocksX)));
}

template <typename Launch>
int InChunks(const BucketSegment* segs, int n, Launch launch) {
  for (int first = 0; first < n; first += kMaxSegmentsPerLaunch) {
    SegmentTable t{};
    const int k = std::min(kMaxSegmentsPerLaunch, n - first);
    size_t longest = 0;
    for (int j = 0; j < k; ++j) {
      t.seg[j] = segs[first + j];
      longest = std::max(longest, t.seg[j].count);
    }
    if (longest == 0) continue;
    launch(t, dim3(BlocksFor(longest), static_cast<unsigned>(k)));
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

int BucketPackLaunch(const BucketSegment* segs, int n, void* bucket, int bucket_dtype,
                     size_t bucket_count, float scale, void* stream) {
  if (FirstBadSegment(segs, n, bucket, bucket_dtype, bucket_count) >= 0) {
    return cudaErrorInvalidValue;
  }
  auto s = static_cast<cudaStream_t>(stream);
  return InChunks(segs, n, [&](const SegmentTable& t, dim3 grid) {
    PackKernel<<<grid, kThreads, 0, s>>>(t, bucket, bucket_dtype, scale);
  });
}

int BucketUnpackLaunch(const BucketSegment* segs, int n, const void* bucket, int bucket_dtype,
                       size_t bucket_count, float scale, void* stream) {
  if (FirstBadSegment(segs, n, bucket, bucket_dtype, bucket_count) >= 0) {
    return cudaErrorInvalidValue;
  }
  auto s = static_cast<cudaStream_t>(stream);
  return InChunks(segs, n, [&](const SegmentTable& t, dim3 grid) {
    UnpackKernel<<<grid, kThreads, 0, s>>>(t, bucket, bucket_dtype, scale);
  });
}

int CastScaleLaunch(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                    const ScaleArgs& scale, void* stream) {
  if (!ValidDType(src_dtype) || !ValidDType(dst_dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (src == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  CastScaleKernel<<<BlocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      src, src_dtype, dst, dst_dtype, n, scale);
  return cudaGetLastError();
}

int AddLaunch(const void* a, const void* b, void* dst, size_t n, int dtype, void* stream) {
  if (!ValidDType(dtype)) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (a == nullptr || b == nullptr || dst == nullptr) return cudaErrorInvalidValue;
  AddKernel<<<BlocksFor(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a, b, dst, n, dtype);
  return cudaGetLastError();
}

const char* BucketKernelsErrorString(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace braid::nccl::kernels
