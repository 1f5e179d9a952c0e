// Bucket pack/unpack (scale fused) and cast kernels. On CPU (always): the shared element rule
// matches comm/half.h exactly (all 2^16 halves, a sweep of floats), the reference packs and
// unpacks what a plain loop would, and bad segments are refused naming the segment, before any
// CUDA call. On a GPU: every kernel against the reference, bit for bit, over dtypes, sizes,
// scales and more segments than one launch takes; skipped without a device (CUDA 35 / 100).
#include "backends/nccl/kernels/bucket_kernels.h"

#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backends/nccl/kernels/bucket_reference.h"
#include "comm/cuda_device.h"
#include "comm/dtype.h"
#include "comm/half.h"
#include "comm/reduce_kernels.h"
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
  CastScaleReference(bb.data(), kBF16, f.data(), kF32, 2, ScaleArgs{1, 0.5f, 0});
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
  EXPECT_EQ(CastScaleLaunch(g.data(), 1, bucket.data(), kF32, 4, ScaleArgs{}, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(CastScaleLaunch(nullptr, kF32, bucket.data(), kF32, 4, ScaleArgs{}, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(CastScaleLaunch(nullptr, kF32, nullptr, kF32, 0, ScaleArgs{}, nullptr), 0);
  EXPECT_EQ(AddLaunch(g.data(), g.data(), g.data(), 4, 1, nullptr),  // f64: no kernel
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(AddLaunch(g.data(), nullptr, g.data(), 4, kF32, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
  EXPECT_EQ(AddLaunch(nullptr, nullptr, nullptr, 0, kF32, nullptr), 0);
}

// ---- The scaled cast and the add against the host's BufferOps arithmetic ---------------------

// f32 bit patterns that stress the rule: signed zeros, the smallest and largest subnormals,
// normals near the f16/bf16 limits, values that round to a tie in bf16 / f16, infinities, a
// quiet NaN with a payload, a signalling NaN, a negative NaN, and values whose division by 3
// is inexact.
std::vector<uint32_t> AwkwardBits() {
  return {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x3f800000u,
          0xbf800000u, 0x3f808000u, 0x3f818000u, 0x3f802000u, 0x477fe000u, 0x477ff000u,
          0xc77ff000u, 0x33800000u, 0x33000000u, 0x387fc000u, 0x38800000u, 0x40400000u,
          0x3eaaaaabu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00001u,
          0x7f800123u, 0xffc12345u, 0x4b7fffffu, 0x3dcccccdu};
}

// n awkward elements of `dtype` (narrowed from the f32 patterns, then their halves' own
// patterns where the dtype is 16-bit: subnormal halves, half NaNs and infinities).
std::vector<uint8_t> AwkwardElems(int dtype) {
  std::vector<uint8_t> out;
  std::vector<uint32_t> bits = AwkwardBits();
  const size_t es = ElemSize(dtype);
  auto push16 = [&](uint16_t h) {
    out.resize(out.size() + 2);
    std::memcpy(out.data() + out.size() - 2, &h, 2);
  };
  for (uint32_t u : bits) {
    if (dtype == kF32) {
      out.resize(out.size() + 4);
      std::memcpy(out.data() + out.size() - 4, &u, 4);
    } else {
      push16(static_cast<uint16_t>(u >> 16));  // bf16-ish patterns: also valid halves
      push16(static_cast<uint16_t>(u & 0xffffu));
    }
  }
  if (es == 2) {
    for (uint16_t h :
         {0x0001, 0x03ff, 0x8001, 0x7c00, 0xfc00, 0x7e01, 0x7c01, 0x0400, 0x7bff, 0x3c01, 0x3555}) {
      push16(h);
    }
  }
  return out;
}

ScaleArgs ArgsOf(const ScaleSpec& s) {
  return ScaleArgs{s.apply_mul ? 1 : 0, static_cast<float>(s.mul), s.div};
}

const ScaleSpec kSpecs[] = {{false, 1.0, 0}, {false, 1.0, 2}, {false, 1.0, 3},
                            {false, 1.0, 6}, {true, 0.5, 0},  {true, 1.0 / 3, 0},
                            {true, 0.1, 4},  {true, 0.0, 0},  {true, 3.0e38, 0}};

TEST(BucketReference, ScaledCastMatchesTheHostBitForBit) {
  const int dtypes[] = {kF32, kBF16, kF16};
  for (int s : dtypes) {
    const std::vector<uint8_t> src = AwkwardElems(s);
    const size_t n = src.size() / ElemSize(s);
    for (int d : dtypes) {
      for (const ScaleSpec& spec : kSpecs) {
        std::vector<uint8_t> want(n * ElemSize(d), 0xab), got(n * ElemSize(d), 0xcd);
        braid::CastScale(src.data(), static_cast<DType>(s), want.data(), static_cast<DType>(d), n,
                         spec);
        CastScaleReference(src.data(), s, got.data(), d, n, ArgsOf(spec));
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(
              std::memcmp(got.data() + i * ElemSize(d), want.data() + i * ElemSize(d), ElemSize(d)),
              0)
              << s << " -> " << d << " mul " << spec.apply_mul << "/" << spec.mul << " div "
              << spec.div << " element " << i;
        }
      }
    }
  }
  // In place (the reducer's f16 post-divide): dst == src.
  std::vector<uint8_t> x = AwkwardElems(kF16), want = x;
  const size_t n = x.size() / 2;
  braid::CastScale(want.data(), DType::kF16, want.data(), DType::kF16, n, {false, 1.0, 3});
  CastScaleReference(x.data(), kF16, x.data(), kF16, n, ScaleArgs{0, 1.0f, 3});
  EXPECT_EQ(x, want);
}

TEST(BucketReference, AddMatchesTheHostBitForBit) {
  for (int t : {kF32, kBF16, kF16}) {
    const std::vector<uint8_t> v = AwkwardElems(t);
    const size_t es = ElemSize(t), m = v.size() / es;
    // Every ordered pair of awkward values: a[k] = v[k / m], b[k] = v[k % m].
    std::vector<uint8_t> a(m * m * es), b(m * m * es);
    for (size_t k = 0; k < m * m; ++k) {
      std::memcpy(a.data() + k * es, v.data() + (k / m) * es, es);
      std::memcpy(b.data() + k * es, v.data() + (k % m) * es, es);
    }
    std::vector<uint8_t> want(a.size()), got(a.size());
    const void* in[2] = {a.data(), b.data()};
    ReduceInto(in, 2, want.data(), m * m, static_cast<DType>(t), ReduceOp::Sum(), 2);
    AddReference(a.data(), b.data(), got.data(), m * m, t);
    size_t compared = 0;
    for (size_t k = 0; k < m * m; ++k) {
      // Both NaN: the host returns whichever operand its compiler put first (gcc's vaddps
      // takes the array element as the first source); the kernels return a's. Not compared.
      if (IsNaN(LoadAs(a.data(), k, t)) && IsNaN(LoadAs(b.data(), k, t))) continue;
      ++compared;
      ASSERT_EQ(std::memcmp(got.data() + k * es, want.data() + k * es, es), 0)
          << "dtype " << t << " pair " << k / m << " + " << k % m;
    }
    EXPECT_GT(compared, m * m * 3 / 4);
    // dst aliasing a (the reducer's partial += shard): the same as a separate dst.
    AddReference(a.data(), b.data(), a.data(), m * m, t);
    EXPECT_EQ(a, got);
  }
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
      ASSERT_EQ(
          BucketUnpackLaunch(dev_segs.data(), 70, d_bucket, bdt, offset, 1.0f / scale, stream_), 0);
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
      CastScaleReference(src.data(), s, want.data(), d, n, ScaleArgs{1, 0.5f, 0});
      void* d_src = Device(src.data(), src.size());
      void* d_dst = Device(want.data(), want.size());
      ASSERT_EQ(cudaMemsetAsync(d_dst, 0, want.size(), stream_), cudaSuccess);
      ASSERT_EQ(CastScaleLaunch(d_src, s, d_dst, d, n, ScaleArgs{1, 0.5f, 0}, stream_), 0);
      ASSERT_EQ(Host(d_dst, want.size()), want) << s << " -> " << d;
    }
  }
}

// The scaled cast (mul, true division, in place) and the add on the device against the
// reference (itself checked against the host above) on awkward values: subnormals, infinities,
// NaN payloads, rounding ties, invalid operations.
TEST_F(BucketKernelsGpu, ScaledCastMatchesTheReferenceOnAwkwardValues) {
  const int dtypes[] = {kF32, kBF16, kF16};
  for (int s : dtypes) {
    std::vector<uint8_t> src = AwkwardElems(s);
    const std::vector<uint8_t> rnd = RandomElems(s, 4099, 11 + s);
    src.insert(src.end(), rnd.begin(), rnd.end());
    const size_t n = src.size() / ElemSize(s);
    for (int d : dtypes) {
      for (const ScaleSpec& spec : kSpecs) {
        std::vector<uint8_t> want(n * ElemSize(d));
        CastScaleReference(src.data(), s, want.data(), d, n, ArgsOf(spec));
        void* d_src = Device(src.data(), src.size());
        void* d_dst = s == d ? d_src : Device(want.data(), want.size());  // in place
        ASSERT_EQ(CastScaleLaunch(d_src, s, d_dst, d, n, ArgsOf(spec), stream_), 0);
        ASSERT_EQ(Host(d_dst, want.size()), want) << s << " -> " << d << " mul " << spec.apply_mul
                                                  << "/" << spec.mul << " div " << spec.div;
      }
    }
  }
}

TEST_F(BucketKernelsGpu, AddMatchesTheReferenceOnAwkwardValues) {
  for (int t : {kF32, kBF16, kF16}) {
    const std::vector<uint8_t> v = AwkwardElems(t);
    const size_t es = ElemSize(t), m = v.size() / es;
    std::vector<uint8_t> a(m * m * es), b(m * m * es);
    for (size_t k = 0; k < m * m; ++k) {
      std::memcpy(a.data() + k * es, v.data() + (k / m) * es, es);
      std::memcpy(b.data() + k * es, v.data() + (k % m) * es, es);
    }
    const std::vector<uint8_t> ra = RandomElems(t, 70001, 5), rb = RandomElems(t, 70001, 6);
    a.insert(a.end(), ra.begin(), ra.end());
    b.insert(b.end(), rb.begin(), rb.end());
    const size_t n = a.size() / es;
    std::vector<uint8_t> want(a.size());
    AddReference(a.data(), b.data(), want.data(), n, t);
    void* d_a = Device(a.data(), a.size());
    void* d_b = Device(b.data(), b.size());
    ASSERT_EQ(AddLaunch(d_a, d_b, d_a, n, t, stream_), 0);  // in place, as the reducer adds
    ASSERT_EQ(Host(d_a, want.size()), want) << "dtype " << t;
  }
}

}  // namespace
}  // namespace braid::nccl::kernels
