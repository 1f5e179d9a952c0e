// The GradientReducer end to end on a real GPU: a single-rank `nccl` world (NCCL allows one
// rank per device), bucket storage in device memory, gradients copied in on a compute stream
// and marked ready with events recorded there, every bucket operation on the comm streams,
// results read back and compared bit for bit with the serial reference. All-reduce,
// reduce-scatter and hybrid (1 x 1 mesh), f32 and bf16 reduced in f32, f16 and mixed dtypes
// reduced natively, no_sync, copy-in, reduce_scatter_only (the add kernel on the partial
// shards). A world of one rank has no f16 post-divide (the divide factor is 1), so the scaled
// cast and the add are also run directly through the group's BufferOps against the host's
// (BufferOpsMatchTheHost: awkward values, in place, bit for bit).
// Multi-rank arithmetic is covered on the fake device (nccl_reducer_test); this checks the
// real runtime, the real kernels and real stream semantics. Skips without a GPU (CUDA
// error 35 or 100).
//
//   tools/bazelw test //tests/nccl:nccl_reducer_gpu_test --test_output=all
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/buffer_ops.h"
#include "gtest/gtest.h"
#include "tests/nccl/device_reducer_driver.h"
#include "tests/nccl/real_gpu_world.h"

namespace braid::nccl::testing {
namespace {

using sched::ReduceMode;
using sched::reference::Scenario;
using sched::reference::ScenarioName;

class NcclReducerGpuTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(NcclReducerGpuTest, MatchesSerialReference) {
  BRAID_SKIP_WITHOUT_GPU();
  auto w = MakeRealSingleRankWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  const absl::Status s =
      RunDeviceScenario(*w->world, w->apis.cuda, GetParam(), ExactGrad, absl::Seconds(60));
  EXPECT_TRUE(s.ok()) << s;
}

// Credit-sized partitions on the device (scheduler/op_scheduler.h).
Scenario WithCredit(Scenario sc, size_t credit) {
  sc.credit = credit;
  return sc;
}

INSTANTIATE_TEST_SUITE_P(
    Modes, NcclReducerGpuTest,
    ::testing::Values(Scenario{ReduceMode::kAllReduce, 1, 1, 0, "NS"},
                      Scenario{ReduceMode::kAllReduce, 1, 1, 1, "NS", false, true},
                      Scenario{ReduceMode::kAllReduce, 1, 1, 0, "NS", true},
                      Scenario{ReduceMode::kReduceScatter, 1, 1, 0, "NS"},
                      Scenario{ReduceMode::kReduceScatter, 1, 1, 1, "NS", false, true},
                      Scenario{ReduceMode::kHybrid, 1, 1, 0, "NS"},
                      Scenario{ReduceMode::kHybrid, 1, 1, 1, "NNS", false, true},
                      Scenario{ReduceMode::kAllReduce, 1, 1, 2, "NS"},
                      Scenario{ReduceMode::kReduceScatter, 1, 1, 3, "NS"},
                      Scenario{ReduceMode::kHybrid, 1, 1, 0, "RRS"},
                      Scenario{ReduceMode::kHybrid, 1, 1, 1, "RNRS"},
                      Scenario{ReduceMode::kHybrid, 1, 1, 2, "RRS"},
                      Scenario{ReduceMode::kHybrid, 1, 1, 1, "RRS", false, true},
                      WithCredit(Scenario{ReduceMode::kAllReduce, 1, 1, 0, "NS"}, 256),
                      WithCredit(Scenario{ReduceMode::kReduceScatter, 1, 1, 1, "NS", false, true},
                                 256)),
    [](const ::testing::TestParamInfo<Scenario>& i) { return ScenarioName(i.param); });

// NcclBufferOps' scaled cast (the f16 post-divide, a premultiply) and add on the real device
// against HostBufferOps, bit for bit, in place, on values that stress rounding: ties,
// subnormals, infinities, NaNs, invalid operations.
std::vector<uint8_t> StressElems(DType t, size_t n) {
  std::vector<uint8_t> out(n * DTypeSize(t));
  uint32_t z = 12345;
  for (size_t i = 0; i < n; ++i) {
    z = z * 1664525u + 1013904223u;
    uint32_t bits = z;
    if (i % 7 == 0) bits &= 0x807fffffu;   // subnormals (and zeros)
    if (i % 11 == 0) bits |= 0x7f800000u;  // infinities and NaNs
    if (t == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &bits, 4);
    } else {
      const uint16_t h = static_cast<uint16_t>(i % 2 ? bits >> 16 : bits);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

TEST(NcclReducerGpuBufferOps, BufferOpsMatchTheHost) {
  BRAID_SKIP_WITHOUT_GPU();
  auto w = MakeRealSingleRankWorld();
  ASSERT_TRUE(w.ok()) << w.status();
  BufferOps& dev = w->world->buffer_ops();
  BufferOps& host = HostBufferOps();
  const size_t n = 100003;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    const size_t bytes = n * DTypeSize(t);
    const std::vector<uint8_t> a = StressElems(t, n), b = StressElems(t, n + 1);
    auto da = dev.Allocate(bytes, "a");
    auto db = dev.Allocate(bytes, "b");
    ASSERT_TRUE(da.ok() && db.ok());
    for (const ScaleSpec& spec : {ScaleSpec{false, 1.0, 2}, ScaleSpec{false, 1.0, 3},
                                  ScaleSpec{true, 0.5, 0}, ScaleSpec{true, 0.1, 6}}) {
      std::vector<uint8_t> want = a, got(bytes);
      ASSERT_TRUE(host.CastScale(want.data(), t, want.data(), t, n, spec).ok());
      ASSERT_TRUE(dev.Copy(da->get(), a.data(), bytes).ok());
      ASSERT_TRUE(dev.CastScale(da->get(), t, da->get(), t, n, spec).ok());
      ASSERT_TRUE(dev.Copy(got.data(), da->get(), bytes).ok());
      ASSERT_TRUE(dev.Synchronize(deadline).ok());
      EXPECT_EQ(got, want) << DTypeName(t) << " mul " << spec.mul << " div " << spec.div;
    }
    // Add, in place (partial += shard). Pairs of NaNs are left out: the host returns the
    // operand its compiler placed first (bucket_convert.h).
    std::vector<uint8_t> bb = b;
    bb.resize(bytes);
    for (size_t i = 0; i < n; ++i) {
      const size_t es = DTypeSize(t);
      auto nan = [&](const std::vector<uint8_t>& v) {
        if (t == DType::kF32) {
          uint32_t u;
          std::memcpy(&u, v.data() + 4 * i, 4);
          return (u & 0x7fffffffu) > 0x7f800000u;
        }
        uint16_t h;
        std::memcpy(&h, v.data() + 2 * i, 2);
        return t == DType::kBF16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
      };
      if (nan(a) && nan(bb)) std::memset(bb.data() + i * es, 0, es);
    }
    std::vector<uint8_t> want(bytes), got(bytes);
    ASSERT_TRUE(host.Add(a.data(), bb.data(), want.data(), n, t).ok());
    ASSERT_TRUE(dev.Copy(da->get(), a.data(), bytes).ok());
    ASSERT_TRUE(dev.Copy(db->get(), bb.data(), bytes).ok());
    ASSERT_TRUE(dev.Add(da->get(), db->get(), da->get(), n, t).ok());
    ASSERT_TRUE(dev.Copy(got.data(), da->get(), bytes).ok());
    ASSERT_TRUE(dev.Synchronize(deadline).ok());
    EXPECT_EQ(got, want) << "add " << DTypeName(t);
  }
}

}  // namespace
}  // namespace braid::nccl::testing
