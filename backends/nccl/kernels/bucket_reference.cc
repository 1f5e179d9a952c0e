#include "backends/nccl/kernels/bucket_reference.h"

#include "absl/strings/str_cat.h"

namespace braid::nccl::kernels {

absl::Status CheckSegments(const BucketSegment* segs, int n, const void* bucket, int bucket_dtype,
                           size_t bucket_count) {
  if (!ValidDType(bucket_dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket dtype ", bucket_dtype, " is not f32 (0), bf16 (2) or f16 (3)"));
  }
  if (n < 0 || (n > 0 && segs == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("bad segment table (n = ", n, ")"));
  }
  if (bucket == nullptr && bucket_count > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket pointer is null with ", bucket_count, " elements"));
  }
  for (int i = 0; i < n; ++i) {
    const BucketSegment& s = segs[i];
    const std::string what = absl::StrCat("segment ", i, " (offset ", s.offset, ", count ", s.count,
                                          ", dtype ", s.dtype, ")");
    if (!ValidDType(s.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dtype is not f32 (0), bf16 (2) or f16 (3)"));
    }
    if (s.count > 0 && s.grad == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": gradient pointer is null"));
    }
    if (s.offset > bucket_count || s.count > bucket_count - s.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": reaches past the bucket's ", bucket_count, " elements"));
    }
  }
  return absl::OkStatus();
}

int FirstBadSegment(const BucketSegment* segs, int n, const void* bucket, int bucket_dtype,
                    size_t bucket_count) {
  if (!ValidDType(bucket_dtype) || n < 0 || (n > 0 && segs == nullptr) ||
      (bucket == nullptr && bucket_count > 0)) {
    return n < 0 ? 0 : n;
  }
  for (int i = 0; i < n; ++i) {
    const BucketSegment& s = segs[i];
    if (!ValidDType(s.dtype) || (s.count > 0 && s.grad == nullptr) || s.offset > bucket_count ||
        s.count > bucket_count - s.offset) {
      return i;
    }
  }
  return -1;
}

void PackReference(const BucketSegment* segs, int n, void* bucket, int bucket_dtype, float scale) {
  for (int k = 0; k < n; ++k) {
    for (size_t i = 0; i < segs[k].count; ++i) {
      ConvertElement(segs[k].grad, i, segs[k].dtype, bucket, segs[k].offset + i, bucket_dtype,
                     scale);
    }
  }
}

void UnpackReference(const BucketSegment* segs, int n, const void* bucket, int bucket_dtype,
                     float scale) {
  for (int k = 0; k < n; ++k) {
    for (size_t i = 0; i < segs[k].count; ++i) {
      ConvertElement(bucket, segs[k].offset + i, bucket_dtype, segs[k].grad, i, segs[k].dtype,
                     scale);
    }
  }
}

void CastScaleReference(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                        const ScaleArgs& scale) {
  for (size_t i = 0; i < n; ++i) CastScaleElement(src, i, src_dtype, dst, dst_dtype, scale);
}

void AddReference(const void* a, const void* b, void* dst, size_t n, int dtype) {
  for (size_t i = 0; i < n; ++i) AddElement(a, b, dst, i, dtype);
}

}  // namespace braid::nccl::kernels
