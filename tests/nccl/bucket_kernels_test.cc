// Bucket pack/unpack (scale fused) and cast kernels. On CPU (always): the shared element rule
// matches comm/half.h exactly (all 2^16 halves, a sweep of floats), the reference packs and
// unpacks what a plain loop would, and bad segments are refused naming the segment, before any
// CUDA call. On a GPU: every kernel against the reference, bit for bit, over dtypes, sizes,
// scales and more segments than one launch takes; skipped without a device (CUDA 35 / 100).
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backends/nccl/kernels/bucket_kernels.h"
#include "backends/nccl/kernels/bucket_reference.h"
#include "comm/dtype.h"
#include "comm/cuda_device.h"
#include "comm/half.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"

namespace braid::nccl::kernels {
namespace {

using braid::testing::ExpectError;

static_assert(kF32 == static_cast<int>(DType::kF32));
static_assert(kBF16 == static_cast<int>(DType::kBF16));
static_assert(kF16 == static_cast<int>(DType::kF16));

TEST(BucketConvert, MatchesCommHalfForEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    ASSERT_EQ(FloatBits(Bf16ToFloat(b)), FloatBits(ToFloat(BF16{b}))) << h;
    ASSERT_EQ(FloatBits(F16ToFloat(b)), FloatBits(ToFloat(F16{b}))) << h;
  }
}

TEST(BucketConvert, NarrowingMatchesCommHalfOnASweepOfFloats) {
  // Every 4093rd bit pattern (about a million floats, all exponents) plus edge cases.
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                0x7fc00000u, 0x477ff000u, 0x477fefffu, 0x38800000u,
                                0x387fffffu, 0x33000000u, 0x3f808000u, 0x3f818000u};
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4093) bits.push_back(static_cast<uint32_t>(u));
  for (uint32_t u : bits) {
    const float f = BitsFloat(u);
    ASSERT_EQ(FloatToBf16(f), ToBF16(f).bits) << std::hex << u;
    ASSERT_EQ(FloatToF16(f), ToF16(f).bits) << std::hex << u;
  }
}

TEST(BucketReference, PacksAndUnpacksWithTheScale) {
  std::vector<float> a = {1.0f, -2.0f, 3.0f};
  std::vector<uint16_t> b = {ToBF16(0.5f).bits, ToBF16(-8.0f).bits};
  std::vector<uint16_t> c = {ToF16(6.0f).bits};
  BucketSegment segs[] = {{a.data(), 0, 3, kF32}, {b.data(), 3, 2, kBF16}, {c.data(), 5, 1, kF16}};
  std::vector<float> bucket(6, -1.0f);
  ASSERT_OK(CheckSegments(segs, 3, bucket.data(), kF32, bucket.size()));
  PackReference(segs, 3, bucket.data(), kF32, 0.25f);
  EXPECT_EQ(bucket, (std::vector<float>{0.25f, -0.5f, 0.75f, 0.125f, -2.0f, 1.5f}));
  for (float& v : bucket) v *= 2;  // "the reduction"
  UnpackReference(segs, 3, bucket.data(), kF32, 2.0f);
  EXPECT_EQ(a, (std::vector<float>{1.0f, -2.0f, 3.0f}));
  EXPECT_EQ(ToFloat(BF16{b[0]}), 0.5f);
  EXPECT_EQ(ToFloat(BF16{b[1]}), -8.0f);
  EXPECT_EQ(ToFloat(F16{c[0]}), 6.0f);
  // bf16 bucket: the pack rounds to nearest even.
  std::vector<float> x = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256};
  std::vector<uint16_t> bb(2);
  BucketSegment one[] = {{x.data(), 0, 2, kF32}};
  PackReference(one, 1, bb.data(), kBF16, 1.0f);
  EXPECT_EQ(bb[0], 0x3f80);  // tie -> even
  EXPECT_EQ(bb[1], 0x3f82);  // tie -> even (up)
  std::vector<float> f(2);
  CastScaleReference(bb.data(), kBF16, f.data(), kF32, 2, 0.5f);
  EXPECT_EQ(f, (std::vector<float>{0.5f, 0.5f + 1.0f / 128}));
}

TEST(BucketReference, BadSegmentsAreRefusedNamingTheSegment) {
  std::vector<float> g(4), bucket(8);
  BucketSegment past[] = {{g.data(), 0, 4, kF32}, {g.data(), 6, 4, kF32}};
  ExpectError(CheckSegments(past, 2, bucket.data(), kF32, 8), absl::StatusCode::kInvalidArgument,
              {"segment 1", "offset 6", "count 4", "past the bucket's 8 elements"});
  EXPECT_EQ(FirstBadSegment(past, 2, bucket.data(), kF32, 8), 1);
  BucketSegment null_grad[] = {{nullptr, 0, 4, kF32}};
  ExpectError(CheckSegments(null_grad, 1, bucket.data(), kF32, 8),
              absl::StatusCode::kInvalidArgument, {"segment 0", "gradient pointer is null"});
  BucketSegment bad_dtype[] = {{g.data(), 0, 4, 1}};  // f64: not a bucket dtype
  ExpectError(CheckSegments(bad_dtype, 1, bucket.data(), kF32, 8),
              absl::StatusCode::kInvalidArgument, {"segment 0", "dtype 1"});
  ExpectError(CheckSegments(past, 1, bucket.data(), 5, 8), absl::StatusCode::kInvalidArgument,
              {"bucket dtype 5"});
  EXPECT_EQ(FirstBadSegment(past, 1, bucket.data(), kF32, 8), -1);
  // The launchers refuse the same input before any CUDA call (so this runs without a GPU).
  EXPECT_EQ(BucketPackLaunch(past, 2, bucket.data(), kF32, 8, 1.0f, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(BucketUnpackLaunch(null_grad, 1, bucket.data(), kF32, 8, 1.0f, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(CastScaleLaunch(g.data(), 1, bucket.data(), kF32, 4, 1.0f, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(CastScaleLaunch(nullptr, kF32, bucket.data(), kF32, 4, 1.0f, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(CastScaleLaunch(nullptr, kF32, nullptr, kF32, 0, 1.0f, nullptr), 0);
}

// ---- On the device ----------------------------------------------------------------------------

class BucketKernelsGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    const int rc = CudaKernelDeviceStatus();
    if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
      GTEST_SKIP() << "no GPU: " << BucketKernelsErrorString(rc) << " (" << rc << ")";
    }
    ASSERT_EQ(rc, cudaSuccess) << BucketKernelsErrorString(rc);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* Device(const void* host, size_t bytes) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, bytes == 0 ? 1 : bytes), cudaSuccess);
    owned_.emplace_back(d);
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
    return d;
  }
  std::vector<uint8_t> Host(const void* d, size_t bytes) {
    std::vector<uint8_t> h(bytes);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return h;
  }
  struct Free {
    void operator()(void* p) const { cudaFree(p); }
  };
  cudaStream_t stream_ = nullptr;
  std::vector<std::unique_ptr<void, Free>> owned_;
};

std::vector<uint8_t> RandomElems(int dtype, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  std::vector<uint8_t> out(n * ElemSize(dtype));
  for (size_t i = 0; i < n; ++i) StoreAs(out.data(), i, dtype, dist(rng));
  return out;
}

TEST_F(BucketKernelsGpu, PackAndUnpackMatchTheReferenceBitForBit) {
  const int dtypes[] = {kF32, kBF16, kF16};
  const float scales[] = {1.0f, 0.125f, 1.0f / 3.0f};
  const size_t sizes[] = {0, 1, 3, 1000, 70001};
  for (int bdt : dtypes) {
    for (float scale : scales) {
      // More segments than one launch takes (64), of every size and dtype.
      std::vector<std::vector<uint8_t>> grads;
      std::vector<BucketSegment> host_segs, dev_segs;
      size_t offset = 0;
      for (int k = 0; k < 70; ++k) {
        const int gdt = dtypes[k % 3];
        const size_t n = sizes[k % 5];
        grads.push_back(RandomElems(gdt, n, 1000 * k + bdt));
        host_segs.push_back({grads.back().data(), offset, n, gdt});
        dev_segs.push_back({Device(grads.back().data(), grads.back().size()), offset, n, gdt});
        offset += n + (k % 2);  // gaps: unaligned offsets
      }
      const size_t bytes = offset * ElemSize(bdt);
      std::vector<uint8_t> want(bytes, 0);
      void* d_bucket = Device(want.data(), bytes);
      PackReference(host_segs.data(), 70, want.data(), bdt, scale);
      ASSERT_EQ(BucketPackLaunch(dev_segs.data(), 70, d_bucket, bdt, offset, scale, stream_), 0);
      ASSERT_EQ(Host(d_bucket, bytes), want) << "pack: bucket dtype " << bdt << " scale " << scale;
      UnpackReference(host_segs.data(), 70, want.data(), bdt, 1.0f / scale);
      ASSERT_EQ(BucketUnpackLaunch(dev_segs.data(), 70, d_bucket, bdt, offset, 1.0f / scale,
                                   stream_),
                0);
      for (size_t k = 0; k < 70; ++k) {
        ASSERT_EQ(Host(dev_segs[k].grad, grads[k].size()), grads[k]) << "unpack segment " << k;
      }
    }
  }
}

TEST_F(BucketKernelsGpu, CastScaleMatchesTheReference) {
  const int dtypes[] = {kF32, kBF16, kF16};
  for (int s : dtypes) {
    for (int d : dtypes) {
      const size_t n = 100003;
      std::vector<uint8_t> src = RandomElems(s, n, 7 + s + 10 * d);
      std::vector<uint8_t> want(n * ElemSize(d));
      CastScaleReference(src.data(), s, want.data(), d, n, 0.5f);
      void* d_src = Device(src.data(), src.size());
      void* d_dst = Device(want.data(), want.size());
      ASSERT_EQ(cudaMemsetAsync(d_dst, 0, want.size(), stream_), cudaSuccess);
      ASSERT_EQ(CastScaleLaunch(d_src, s, d_dst, d, n, 0.5f, stream_), 0);
      ASSERT_EQ(Host(d_dst, want.size()), want) << s << " -> " << d;
    }
  }
}

}  // namespace
}  // namespace braid::nccl::kernels
