// Cast gathers (GathererConfig::quant bf16 / f16: MixedPrecisionPolicy.param_dtype's wire) on a
// device group, the `nccl` backend's fake device (fake_gpu.h: "device" memory is host memory,
// streams are FIFOs that run only when something waits on them, so a missing wait or a Work that
// completes before the widening reads stale values). At 2 and 3 ranks, over buckets of odd sizes
// (the last shard padded), in two rounds (an optimizer step rewrote the shards in between, on a
// producer stream the gather waits on through Prefetch's `ready` event):
//  - every rank's gathered f32 buffer equals, bit for bit, a serial reference (each element
//    rounded with comm/half.h, widened) and the host path's result (the same gather on the
//    `local` backend); ties, subnormals, overflow to inf, -0 and NaN included;
//  - the shard (the master weights) stays exact; the 2-byte records are one device buffer
//    (the largest bucket's, every rank's) counted as kStaging until the gatherer goes, and
//    nothing is allocated on the host;
//  - a gather's Work (and so WaitParams) completes only once the widening kernel has run: with
//    that kernel held back on the stream, the gathers stay in flight;
//  - int8 / fp8 on a device group are refused by name at Create.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/nccl/cuda_handles.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/kernels/bucket_convert.h"
#include "backends/nccl/kernels/bucket_reference.h"
#include "comm/half.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "scheduler/memory_stats.h"
#include "scheduler/param_gatherer.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl::testing {
namespace {

using braid::testing::ExpectError;
using sched::Bucket;
using sched::BucketPlan;
using sched::GatherDType;
using sched::GathererConfig;
using sched::ParamGatherer;
using sched::ParamSpec;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Odd sizes: at 2 and 3 ranks most buckets are padded (the plan pads to shards x align).
std::vector<ParamSpec> Params(Device device) {
  const size_t sizes[] = {1, 37, 301, 1025, 65, 13, 4099, 7, 515, 3, 129};
  std::vector<ParamSpec> ps;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    ps.push_back(ParamSpec{static_cast<sched::ParamId>(10 + i), sizes[i], DType::kF32, device,
                           absl::StrCat("layer", i, ".weight")});
  }
  return ps;
}

BucketPlan MakePlan(Device device, int shards) {
  sched::PlanOptions o;
  o.shards = shards;
  o.first_bucket_cap_bytes = 1024;
  o.bucket_cap_bytes = 8192;
  auto plan = BucketPlan::Build(Params(device), o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// Rank r's shard of bucket b in round k: varied magnitudes, exact bf16 and f16 ties (1 + 2^-8
// and 1 + 3 x 2^-8; 1 + 2^-11 and 1 + 3 x 2^-11), values below the f16 and f32 normal ranges,
// beyond f16's range (to inf), infinities, -0 and a NaN.
float ShardValue(int r, int b, size_t j, int k) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {
      1.00390625f, 1.01171875f, 1.00048828125f, 1.00146484375f, -1.00390625f, 3e-6f, 1e-7f, 2.5e-8f,
      1e-40f,      70000.0f,    -65520.0f,      3.0e38f,        inf,          -inf,  -0.0f, 0.0f};
  if (j % 53 == 7) return specials[(j / 53 + r + b + k) % std::size(specials)];
  if (j % 211 == 11) return std::numeric_limits<float>::quiet_NaN();
  const double phase = 0.37 * static_cast<double>(j) + 1.3 * r + 0.7 * b + 2.1 * k;
  return static_cast<float>(std::sin(phase) * std::pow(10.0, static_cast<int>((j / 50) % 5) - 3));
}

// comm/half.h's rounding, widened back.
float Through(GatherDType t, float x) {
  return t == GatherDType::kBF16 ? ToFloat(ToBF16(x)) : ToFloat(ToF16(x));
}

struct Case {
  int ranks;
  GatherDType dtype;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.ranks << " ranks, " << sched::GatherDTypeName(c.dtype);
}

constexpr int kRounds = 2;

// Gathered[round][rank][bucket]: the bucket's parameters' values, in plan order.
using Gathered = std::vector<std::vector<std::vector<std::vector<float>>>>;

Gathered EmptyResults(int ranks, int buckets) {
  return Gathered(kRounds, std::vector<std::vector<std::vector<float>>>(
                               ranks, std::vector<std::vector<float>>(buckets)));
}

std::vector<float> ReadBucket(const ParamGatherer& pg, int b) {
  std::vector<float> out;
  for (int p : pg.plan().buckets()[b].params) {
    auto v = pg.ParamView(pg.plan().params()[p].id);
    EXPECT_TRUE(v.ok()) << v.status();
    if (!v.ok()) return out;
    const float* got = static_cast<const float*>(v->data);
    out.insert(out.end(), got, got + v->count);
  }
  return out;
}

GathererConfig CastConfig(GatherDType t, sched::MemoryStats* memory) {
  GathererConfig gc;
  gc.timeout = absl::Seconds(60);
  gc.fully_sharded = true;
  gc.memory = memory;
  gc.quant = {t, 4096};
  return gc;
}

// The host path: the same plan on CPU buffers over the `local` backend.
Gathered HostResults(const Case& c) {
  const int buckets = static_cast<int>(MakePlan(Device::Cpu(), c.ranks).buckets().size());
  Gathered out = EmptyResults(c.ranks, buckets);
  braid::testing::RunRanks(c.ranks, [&](Group& g) {
    const int me = g.rank();
    auto made =
        ParamGatherer::Create(MakePlan(Device::Cpu(), c.ranks), &g, CastConfig(c.dtype, nullptr));
    ASSERT_TRUE(made.ok()) << made.status();
    ParamGatherer& pg = **made;
    for (int k = 0; k < kRounds; ++k) {
      for (int b = 0; b < pg.num_buckets(); ++b) {
        float* p = static_cast<float*>(pg.ShardView(b)->data);
        for (size_t j = 0; j < pg.plan().buckets()[b].shard_count; ++j)
          p[j] = ShardValue(me, b, j, k);
      }
      for (int b = 0; b < pg.num_buckets(); ++b) ASSERT_OK(pg.Prefetch(b));
      ASSERT_OK(pg.WaitAll());
      for (int b = 0; b < pg.num_buckets(); ++b) {
        out[k][me][b] = ReadBucket(pg, b);
        ASSERT_OK(pg.Release(b));
      }
    }
  });
  return out;
}

// The device gatherer's staging: every rank's 2-byte records of the largest bucket.
int64_t RecordBytes(const BucketPlan& plan) {
  size_t largest = 0;
  for (const Bucket& bk : plan.buckets()) largest = std::max(largest, bk.shard_count);
  return static_cast<int64_t>(largest * 2 * static_cast<size_t>(plan.options().shards));
}

// One rank on the fake device: per round, the new shards are copied in on a producer stream
// (whose event every Prefetch passes as `ready`), every bucket is prefetched, then waited for.
absl::Status RunDeviceRank(NcclGroup& world, FakeGpu& gpu, const Case& c, Gathered* out,
                           std::mutex* out_mu) {
  const int me = world.rank();
  std::shared_ptr<CudaApi> cuda = gpu.cuda;
  sched::MemoryStats memory;
  ASSIGN_OR_RETURN(auto pg, ParamGatherer::Create(MakePlan(Device::Cuda(0), c.ranks), &world,
                                                  CastConfig(c.dtype, &memory)));
  const BucketPlan& plan = pg->plan();
  bool padded = false;
  for (const Bucket& bk : plan.buckets()) padded = padded || bk.padded_count > bk.count;
  if (!padded) return absl::InternalError("no bucket is padded: the sizes test nothing");
  ASSIGN_OR_RETURN(CudaStream producer, CudaStream::Create(cuda, "producer stream"));
  ASSIGN_OR_RETURN(CudaEvent written, CudaEvent::Create(cuda));
  std::vector<std::vector<float>> shards(pg->num_buckets());
  for (int k = 0; k < kRounds; ++k) {
    for (int b = 0; b < pg->num_buckets(); ++b) {
      ASSIGN_OR_RETURN(TensorView sv, pg->ShardView(b));
      shards[b].resize(sv.count);
      for (size_t j = 0; j < sv.count; ++j) shards[b][j] = ShardValue(me, b, j, k);
      RETURN_IF_ERROR(CudaStatus(*cuda,
                                 cuda->MemcpyAsync(sv.data, shards[b].data(), sv.bytes(),
                                                   cudaMemcpyHostToDevice, producer.get()),
                                 "cudaMemcpyAsync"));
    }
    RETURN_IF_ERROR(
        CudaStatus(*cuda, cuda->EventRecord(written.get(), producer.get()), "cudaEventRecord"));
    for (int b = 0; b < pg->num_buckets(); ++b) {
      RETURN_IF_ERROR(pg->Prefetch(b, DeviceEvent{written.get()}));
      if (!pg->GatherWork(b)->device_event()) {
        return absl::InternalError(absl::StrCat("bucket ", b, ": gather Work has no device event"));
      }
    }
    RETURN_IF_ERROR(pg->WaitAll());
    const sched::MemorySnapshot snap = memory.Snapshot();
    const auto& staging = snap.by_use[static_cast<int>(sched::MemoryUse::kStaging)];
    if (staging.current != RecordBytes(plan) || staging.peak != RecordBytes(plan)) {
      return absl::InternalError(absl::StrCat("round ", k, ": staging current ", staging.current,
                                              ", peak ", staging.peak, " bytes; expected ",
                                              RecordBytes(plan), " (one set of records)"));
    }
    if (snap.host.peak != 0) {
      return absl::InternalError(absl::StrCat("host bytes allocated: ", snap.host.peak));
    }
    for (int b = 0; b < pg->num_buckets(); ++b) {
      std::vector<float> got = ReadBucket(*pg, b);
      const float* shard = static_cast<const float*>(pg->ShardView(b)->data);
      for (size_t j = 0; j < shards[b].size(); ++j) {
        if (Bits(shard[j]) != Bits(shards[b][j])) {
          return absl::InternalError(absl::StrCat("bucket ", b, ": shard element ", j, " changed"));
        }
      }
      {
        std::lock_guard<std::mutex> lock(*out_mu);
        (*out)[k][me][b] = std::move(got);
      }
      RETURN_IF_ERROR(pg->Release(b));
    }
  }
  pg.reset();
  const int64_t left =
      memory.Snapshot().by_use[static_cast<int>(sched::MemoryUse::kStaging)].current;
  if (left != 0) return absl::InternalError(absl::StrCat(left, " staging bytes left"));
  return absl::OkStatus();
}

class NcclCastGather : public ::testing::TestWithParam<Case> {};

TEST_P(NcclCastGather, MatchesReferenceAndHostPathBitForBit) {
  const Case c = GetParam();
  const BucketPlan plan = MakePlan(Device::Cpu(), c.ranks);
  const int buckets = static_cast<int>(plan.buckets().size());
  ASSERT_GE(buckets, 3);
  Gathered device = EmptyResults(c.ranks, buckets);
  std::mutex mu;
  {
    FakeGpu gpu;
    RunFakeRanks(gpu, c.ranks, FakeConfig(), [&](NcclGroup& world) {
      const absl::Status st = RunDeviceRank(world, gpu, c, &device, &mu);
      EXPECT_TRUE(st.ok()) << "rank " << world.rank() << ": " << st;
    });
    ExpectClean(gpu);
  }
  const Gathered host = HostResults(c);
  for (int k = 0; k < kRounds; ++k) {
    for (int b = 0; b < buckets; ++b) {
      // The serial reference: every rank's shard, rounded and widened, then the parameters.
      const Bucket& bk = plan.buckets()[b];
      std::vector<float> full;
      for (int r = 0; r < c.ranks; ++r) {
        for (size_t j = 0; j < bk.shard_count; ++j)
          full.push_back(Through(c.dtype, ShardValue(r, b, j, k)));
      }
      std::vector<float> want;
      for (int p : bk.params) {
        const size_t off = plan.slot(p).offset;
        want.insert(want.end(), full.begin() + off, full.begin() + off + plan.params()[p].count);
      }
      for (int r = 0; r < c.ranks; ++r) {
        const std::vector<float>& got = device[k][r][b];
        ASSERT_EQ(got.size(), want.size()) << "rank " << r << ", bucket " << b;
        ASSERT_EQ(host[k][r][b].size(), want.size()) << "rank " << r << ", bucket " << b;
        for (size_t j = 0; j < want.size(); ++j) {
          ASSERT_EQ(Bits(got[j]), Bits(want[j]))
              << "device, round " << k << ", rank " << r << ", bucket " << b << ", element " << j;
          ASSERT_EQ(Bits(host[k][r][b][j]), Bits(want[j]))
              << "host, round " << k << ", rank " << r << ", bucket " << b << ", element " << j;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, NcclCastGather,
                         ::testing::Values(Case{2, GatherDType::kBF16}, Case{3, GatherDType::kBF16},
                                           Case{2, GatherDType::kF16}, Case{3, GatherDType::kF16}));

// The fake's kernels, except that widening casts (bf16 / f16 -> f32) wait on the stream until
// Open(): what comes after them on the stream (the gather's completion event) waits too.
class GatedWidening : public FakeKernelApi {
 public:
  explicit GatedWidening(std::shared_ptr<FakeCudaApi> cuda) : FakeKernelApi(cuda), cuda_(cuda) {}
  int CastScale(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                const kernels::ScaleArgs& scale, cudaStream_t stream) override {
    if (dst_dtype != kernels::kF32 || src_dtype == kernels::kF32) {
      return FakeKernelApi::CastScale(src, src_dtype, dst, dst_dtype, n, scale, stream);
    }
    std::lock_guard<std::mutex> lock(cuda_->mu());
    cuda_->EnqueueLocked(stream, [=] {
      if (!open_.load()) return false;
      kernels::CastScaleReference(src, src_dtype, dst, dst_dtype, n, scale);
      return true;
    });
    return cudaSuccess;
  }
  void Open() { open_.store(true); }

 private:
  std::shared_ptr<FakeCudaApi> cuda_;
  std::atomic<bool> open_{false};
};

TEST(NcclCastGatherOrder, CompletesOnlyAfterTheWidening) {
  constexpr int kRanks = 2;
  FakeGpu gpu;
  auto gated = std::make_shared<GatedWidening>(gpu.cuda);
  gpu.kernels = gated;
  std::atomic<int> checked{0};
  RunFakeRanks(gpu, kRanks, FakeConfig(), [&](NcclGroup& world) {
    const int me = world.rank();
    sched::MemoryStats memory;
    auto made = ParamGatherer::Create(MakePlan(Device::Cuda(0), kRanks), &world,
                                      CastConfig(GatherDType::kBF16, &memory));
    ASSERT_TRUE(made.ok()) << made.status();
    ParamGatherer& pg = **made;
    for (int b = 0; b < pg.num_buckets(); ++b) {  // Create synchronized the stream: no race
      float* p = static_cast<float*>(pg.ShardView(b)->data);
      for (size_t j = 0; j < pg.plan().buckets()[b].shard_count; ++j)
        p[j] = ShardValue(me, b, j, 0);
    }
    for (int b = 0; b < pg.num_buckets(); ++b) ASSERT_OK(pg.Prefetch(b));
    // Time for the poller to see the all-gathers finish (the first bucket's widening holds back
    // every later operation on this stream).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (int b = 0; b < pg.num_buckets(); ++b) {
      EXPECT_FALSE(pg.GatherWork(b)->Done()) << "rank " << me << ", bucket " << b;
    }
    EXPECT_GT(memory.Snapshot().by_use[static_cast<int>(sched::MemoryUse::kStaging)].current, 0);
    if (checked.fetch_add(1) + 1 == kRanks) gated->Open();
    ASSERT_OK(pg.WaitAll());
    for (int b = 0; b < pg.num_buckets(); ++b) {
      const Bucket& bk = pg.plan().buckets()[b];
      std::vector<float> full;
      for (int r = 0; r < kRanks; ++r) {
        for (size_t j = 0; j < bk.shard_count; ++j)
          full.push_back(Through(GatherDType::kBF16, ShardValue(r, b, j, 0)));
      }
      std::vector<float> got = ReadBucket(pg, b);
      size_t at = 0;
      for (int p : bk.params) {
        const size_t off = pg.plan().slot(p).offset;
        for (size_t j = 0; j < pg.plan().params()[p].count; ++j, ++at) {
          ASSERT_EQ(Bits(got[at]), Bits(full[off + j])) << "bucket " << b << ", element " << at;
        }
      }
      ASSERT_OK(pg.Release(b));
    }
    made->reset();
    EXPECT_EQ(memory.Snapshot().by_use[static_cast<int>(sched::MemoryUse::kStaging)].current, 0);
  });
  ExpectClean(gpu);
}

TEST(NcclCastGatherErrors, Int8AndFp8StayOnHostGroups) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    for (GatherDType t : {GatherDType::kInt8, GatherDType::kFp8E4M3}) {
      ExpectError(
          ParamGatherer::Create(MakePlan(Device::Cuda(0), 2), &world, CastConfig(t, nullptr))
              .status(),
          absl::StatusCode::kUnimplemented,
          {std::string(sched::GatherDTypeName(t)), "host groups", "device stream", "bf16 / f16"});
    }
  });
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
