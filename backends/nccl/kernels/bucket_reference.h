// CPU reference of the bucket kernels (bucket_kernels.h): the same element rule
// (bucket_convert.h), run serially on host memory. Tests compare the kernels with it bit for
// bit; CheckSegments explains a rejected launch (which segment, and why).
//
//   BucketSegment segs[] = {{grad_a, 0, 1000, kBF16}};
//   RETURN_IF_ERROR(CheckSegments(segs, 1, bucket, kF32, 1000));
//   PackReference(segs, 1, bucket, kF32, 1.0f / 4);
#ifndef BRAID_BACKENDS_NCCL_KERNELS_BUCKET_REFERENCE_H_
#define BRAID_BACKENDS_NCCL_KERNELS_BUCKET_REFERENCE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "backends/nccl/kernels/bucket_kernels.h"

namespace braid::nccl::kernels {

// OK, or InvalidArgument naming the bad segment (index, offset, count, dtype) or the bucket.
absl::Status CheckSegments(const BucketSegment* segs, int n, const void* bucket, int bucket_dtype,
                           size_t bucket_count);

// Preconditions: CheckSegments is OK.
void PackReference(const BucketSegment* segs, int n, void* bucket, int bucket_dtype, float scale);
void UnpackReference(const BucketSegment* segs, int n, const void* bucket, int bucket_dtype,
                     float scale);
void CastScaleReference(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                        const ScaleArgs& scale);
void AddReference(const void* a, const void* b, void* dst, size_t n, int dtype);

}  // namespace braid::nccl::kernels

#endif  // BRAID_BACKENDS_NCCL_KERNELS_BUCKET_REFERENCE_H_
