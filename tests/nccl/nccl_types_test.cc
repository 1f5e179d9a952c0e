// Mappings at the edge of the nccl backend: dtypes, FSDP2's reduce-op choices, pre-mul-sum
// scalar encoding, unique-id bytes, and CUDA/NCCL results turned into statuses.
#include "backends/nccl/nccl_types.h"

#include <cstring>

#include "backends/nccl/errors.h"
#include "backends/nccl/unique_id.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl {
namespace {

using braid::testing::ExpectError;

TEST(NcclTypes, EveryDTypeHasAnNcclType) {
  EXPECT_EQ(ToNcclType(DType::kF32), ncclFloat32);
  EXPECT_EQ(ToNcclType(DType::kF64), ncclFloat64);
  EXPECT_EQ(ToNcclType(DType::kBF16), ncclBfloat16);
  EXPECT_EQ(ToNcclType(DType::kF16), ncclFloat16);
  EXPECT_EQ(ToNcclType(DType::kI32), ncclInt32);
  EXPECT_EQ(ToNcclType(DType::kI64), ncclInt64);
  EXPECT_EQ(ToNcclType(DType::kU8), ncclUint8);
}

TEST(NcclTypes, ReductionChoicesFollowFsdp2) {
  auto c = ChooseReduction(ReduceOp::Avg(), DType::kBF16, 8);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->builtin, ncclAvg);
  EXPECT_FALSE(c->premul);
  c = ChooseReduction(ReduceOp::Avg(), DType::kF32, 1);  // AVG at world size 1: SUM
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->builtin, ncclSum);
  c = ChooseReduction(ReduceOp::PreMulSum(0.125), DType::kF16, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->premul);
  EXPECT_EQ(c->scalar, 0.125);
  c = ChooseReduction(ReduceOp::Max(), DType::kI64, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->builtin, ncclMax);
  c = ChooseReduction(ReduceOp::Min(), DType::kU8, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->builtin, ncclMin);
  ExpectError(ChooseReduction(ReduceOp::Avg(), DType::kI32, 4).status(),
              absl::StatusCode::kInvalidArgument, {"avg", "i32"});
  ExpectError(ChooseReduction(ReduceOp::PreMulSum(1.0 / 0.0), DType::kF32, 4).status(),
              absl::StatusCode::kInvalidArgument, {"premul_sum", "finite"});
}

TEST(NcclTypes, PreMulSumScalarIsEncodedInTheDataType) {
  for (DType t : {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}) {
    auto b = EncodeScalar(0.1, t);
    ASSERT_TRUE(b.ok()) << DTypeName(t);
    const double back = DecodeScalar(b->bytes.data(), ToNcclType(t));
    switch (t) {
      case DType::kF64:
        EXPECT_EQ(back, 0.1);
        break;
      case DType::kF32:
        EXPECT_EQ(back, static_cast<double>(0.1f));
        break;
      case DType::kBF16:
        EXPECT_EQ(back, 0.10009765625);
        break;  // bf16 0x3dcd
      case DType::kF16:
        EXPECT_EQ(back, 0.0999755859375);
        break;  // f16 0x2e66
      default:
        break;
    }
  }
  uint16_t bits;
  auto b = EncodeScalar(1.0, DType::kBF16);
  std::memcpy(&bits, b->bytes.data(), 2);
  EXPECT_EQ(bits, 0x3f80);
  ExpectError(EncodeScalar(2.0, DType::kI64).status(), absl::StatusCode::kInvalidArgument,
              {"i64", "scalar"});
}

TEST(NcclTypes, UniqueIdBytesRoundTrip) {
  testing::FakeGpu gpu;
  auto a = NewUniqueIdBytes(*gpu.nccl);
  auto b = NewUniqueIdBytes(*gpu.nccl);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kUniqueIdBytes);
  EXPECT_NE(*a, *b);
  auto id = UniqueIdFromBytes(*a);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(std::memcmp(id->internal, a->data(), kUniqueIdBytes), 0);
  ExpectError(UniqueIdFromBytes("short").status(), absl::StatusCode::kInvalidArgument,
              {"128", "got 5"});
  gpu.nccl->FailNextCall("GetUniqueId", ncclSystemError);
  ExpectError(NewUniqueIdBytes(*gpu.nccl).status(), absl::StatusCode::kInternal,
              {"ncclGetUniqueId", "system error"});
}

TEST(NcclErrorsMapping, CudaAndNcclResultsBecomeStatuses) {
  testing::FakeGpu gpu;
  EXPECT_TRUE(CudaStatus(*gpu.cuda, cudaSuccess, "x").ok());
  ExpectError(CudaStatus(*gpu.cuda, cudaErrorInsufficientDriver, "cudaGetDeviceCount"),
              absl::StatusCode::kFailedPrecondition,
              {"cudaGetDeviceCount", "driver version is insufficient", "CUDA error 35"});
  ExpectError(CudaStatus(*gpu.cuda, cudaErrorNoDevice, "cudaGetDeviceCount"),
              absl::StatusCode::kFailedPrecondition, {"CUDA error 100"});
  ExpectError(CudaStatus(*gpu.cuda, cudaErrorMemoryAllocation, "cudaMalloc"),
              absl::StatusCode::kResourceExhausted, {"cudaMalloc"});
  EXPECT_TRUE(IsNoDevice(cudaErrorInsufficientDriver));
  EXPECT_TRUE(IsNoDevice(cudaErrorNoDevice));
  EXPECT_FALSE(IsNoDevice(cudaErrorInvalidValue));
  EXPECT_TRUE(NcclStatus(*gpu.nccl, ncclSuccess, "x").ok());
  ExpectError(NcclStatus(*gpu.nccl, ncclInvalidUsage, "ncclAllReduce"),
              absl::StatusCode::kInvalidArgument,
              {"ncclAllReduce", "invalid usage", "NCCL error 5"});
  ExpectError(NcclStatus(*gpu.nccl, ncclRemoteError, "ncclAllReduce"),
              absl::StatusCode::kUnavailable, {"NCCL error 6"});
  ExpectError(NcclStatus(*gpu.nccl, ncclInProgress, "ncclAllReduce"), absl::StatusCode::kInternal,
              {"NCCL error 7"});
}

}  // namespace
}  // namespace braid::nccl
