// CUDA kernels that move gradients between their own buffers and a bucket, with the divide
// factor fused and the dtype cast to / from the reduce dtype fused, a cast-and-scale and an
// element-wise add.
//
//   BucketSegment segs[] = {{d_grad_a, 0, 1000, kBF16}, {d_grad_b, 1000, 24, kBF16}};
//   int rc = BucketPackLaunch(segs, 2, d_bucket, kF32, 1024, /*scale=*/1.0f / pre, stream);
//   ... reduce the bucket (f32) on the comm stream ...
//   rc = BucketUnpackLaunch(segs, 2, d_bucket, kF32, 1024, /*scale=*/1.0f / post, stream);
//
// Pack:    bucket[offset + i] = narrow_to(bucket_dtype, widen(grad[i]) * scale)
// Unpack:  grad[i]            = narrow_to(grad_dtype,  widen(bucket[offset + i]) * scale)
// with the element rule of bucket_convert.h (f32 arithmetic, round to nearest even), which the
// CPU reference (bucket_reference.h) shares, so kernel and reference agree bit for bit.
// Launches are asynchronous on `stream` (a cudaStream_t; nullptr = legacy stream): order them
// after the gradients' producer with cudaStreamWaitEvent, and consume the bucket after an event
// recorded on that stream. Every pointer is a device pointer; segments must not overlap.
//
// Each function returns a cudaError_t value as an int: cudaErrorInvalidValue (1) before
// touching the device when a dtype is not kF32/kBF16/kF16, a pointer is null with a nonzero
// count, or a segment reaches past bucket_count (CheckSegments in bucket_reference.h says
// which); else the launch error. No CUDA header here: any host code may include it.
#ifndef BRAID_BACKENDS_NCCL_KERNELS_BUCKET_KERNELS_H_
#define BRAID_BACKENDS_NCCL_KERNELS_BUCKET_KERNELS_H_

#include <cstddef>

#include "backends/nccl/kernels/bucket_convert.h"

namespace braid::nccl::kernels {

struct BucketSegment {
  void* grad = nullptr;  // the gradient's own buffer (read by pack, written by unpack)
  size_t offset = 0;     // where it sits in the bucket, in bucket elements
  size_t count = 0;      // elements
  int dtype = kF32;      // the gradient's dtype
};

// Host-side validation shared by the launchers and the reference: -1 if all is well, else the
// index of the first bad segment (or n when the bucket itself is bad).
int FirstBadSegment(const BucketSegment* segs, int n, const void* bucket, int bucket_dtype,
                    size_t bucket_count);

int BucketPackLaunch(const BucketSegment* segs, int n, void* bucket, int bucket_dtype,
                     size_t bucket_count, float scale, void* stream);
int BucketUnpackLaunch(const BucketSegment* segs, int n, const void* bucket, int bucket_dtype,
                       size_t bucket_count, float scale, void* stream);
// dst[i] = braid::CastScale's element (CastScaleElement in bucket_convert.h), n elements:
// reduce-dtype staging (bf16 <-> f32, ScaleArgs{}) and the f16 post-divide ({0, 1, post}).
// dst may equal src when the dtypes match.
int CastScaleLaunch(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                    const ScaleArgs& scale, void* stream);
// dst[i] = a[i] + b[i] as braid::ReduceInto sums {a, b} (AddElement), n elements of `dtype`;
// dst may alias a or b. The reducer's reduce_scatter_only partial sums.
int AddLaunch(const void* a, const void* b, void* dst, size_t n, int dtype, void* stream);

// Text for a code returned here. Whether the device can run these kernels:
// CudaKernelDeviceStatus() (comm/cuda_device.h).
const char* BucketKernelsErrorString(int code);

}  // namespace braid::nccl::kernels

#endif  // BRAID_BACKENDS_NCCL_KERNELS_BUCKET_KERNELS_H_
