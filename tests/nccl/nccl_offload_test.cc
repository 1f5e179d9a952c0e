// Optimizer state offload (OptimizerConfig::offload, ZeRO-Offload) on the `nccl` backend's fake
// device (fake_gpu.h: "device" memory is host memory, streams are FIFOs run only when something
// waits on them, so a missing wait reads stale data). Complements the offload scenarios of
// nccl_optimizer_test.cc with:
//  - the full matrix {AdamW, SGD} x {reduce-scatter 2, 4 ranks, hybrid 2 x 2} x {f32, bf16},
//    offloaded, bit for bit against the serial unsharded reference (tests/optim), with
//    overlap on and off;
//  - the accounting for both kinds and every mesh: no optimizer state on the device; host
//    kOptimizerState == (3 AdamW, 2 SGD) x each bucket's rounded shard bytes; the two staging
//    buffers per bucket as host kStaging, pinned (cudaMallocHost through the device's BufferOps);
//  - state files: an offloaded optimizer's file is byte for byte the file of a device optimizer
//    at the same step (same format), loads into a device optimizer and back, and a Load into
//    the same offloaded optimizer after steps resumes bit for bit.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "optim/sharded_optimizer.h"
#include "scheduler/memory_stats.h"
#include "tests/multirank.h"
#include "tests/nccl/device_optimizer_driver.h"
#include "tests/nccl/fake_gpu.h"
#include "tests/nccl/fake_step_kernels.h"

namespace braid::nccl::testing {
namespace {

using optim::OptimizerKind;
using optim::testing::NamedScenario;
using optim::testing::OptScenario;
using optim::testing::SyncMode;
using optim::testing::TwoGroupScenario;

OptScenario Offloaded(int replicas, int shards, OptimizerKind kind, DType dtype) {
  OptScenario s = TwoGroupScenario(replicas, shards);
  s.opt.kind = kind;
  s.dtype = dtype;
  s.steps = 3;
  s.opt.offload = true;
  return s;
}

std::vector<NamedScenario> Matrix() {
  std::vector<NamedScenario> out;
  struct Mesh {
    const char* name;
    int replicas, shards;
  };
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    for (Mesh m : {Mesh{"RS2", 1, 2}, Mesh{"RS4", 1, 4}, Mesh{"Hybrid2x2", 2, 2}}) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        const std::string name = absl::StrCat(kind == OptimizerKind::kAdamW ? "AdamW_" : "Sgd_",
                                              m.name, "_", dt == DType::kF32 ? "f32" : "bf16");
        out.push_back({name, Offloaded(m.replicas, m.shards, kind, dt)});
      }
    }
  }
  // Step() instead of the stepper thread, and a no_sync window before the synced backward.
  NamedScenario no_overlap{"AdamW_Hybrid2x2_f32_NoOverlap",
                           Offloaded(2, 2, OptimizerKind::kAdamW, DType::kF32)};
  no_overlap.s.opt.overlap = false;
  out.push_back(no_overlap);
  NamedScenario no_sync{"Sgd_RS4_bf16_NoSync", Offloaded(1, 4, OptimizerKind::kSgd, DType::kBF16)};
  no_sync.s.schedule = {SyncMode::kNoSync, SyncMode::kSync};
  out.push_back(no_sync);
  return out;
}

class NcclOffloadTest : public ::testing::TestWithParam<NamedScenario> {};

TEST_P(NcclOffloadTest, MatchesSerialReference) {
  const OptScenario& s = GetParam().s;
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  RunFakeRanks(gpu, s.replicas * s.shards, FakeConfig(), [&](NcclGroup& world) {
    const absl::Status st = RunDeviceOptimizer(world, gpu.cuda, kernels, s);
    EXPECT_TRUE(st.ok()) << "rank " << world.rank() << ": " << st;
  });
  ExpectClean(gpu);
  EXPECT_EQ(kernels->launches(), 0) << "an offloaded step ran as a device kernel";
}

INSTANTIATE_TEST_SUITE_P(Matrix, NcclOffloadTest, ::testing::ValuesIn(Matrix()),
                         [](const ::testing::TestParamInfo<NamedScenario>& i) {
                           return i.param.name;
                         });

int64_t Rounded(size_t bytes) {
  return static_cast<int64_t>(std::max<size_t>(64, (bytes + 63) / 64 * 64));
}

// Device optimizer state 0 (the device holds only the statistics all-reduce's 2 doubles: the
// stack's reducer and gatherer count nothing); host: master + moments of every bucket's shard
// as kOptimizerState, the gradient and parameter staging shards as kStaging (pinned).
class NcclOffloadMemoryTest : public ::testing::TestWithParam<NamedScenario> {};

TEST_P(NcclOffloadMemoryTest, StateOnTheHost) {
  const OptScenario base = GetParam().s;
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  RunFakeRanks(gpu, base.replicas * base.shards, FakeConfig(), [&](NcclGroup& world) {
    sched::MemoryStats memory;
    OptScenario s = base;
    s.opt.memory = &memory;
    auto st = BuildDeviceStack(world, kernels, s);
    ASSERT_TRUE(st.ok()) << st.status();
    int64_t state = 0, staging = 0;
    for (const sched::Bucket& b : (*st)->reducer->plan().buckets()) {
      state += Rounded(b.shard_count * sizeof(float));
      staging += 2 * Rounded(std::max<size_t>(1, b.shard_count * DTypeSize(b.dtype)));
    }
    state *= s.opt.kind == OptimizerKind::kAdamW ? 3 : 2;
    const int64_t stats = 2 * sizeof(double);
    auto check = [&](const char* when) {
      const sched::MemorySnapshot m = memory.Snapshot();
      EXPECT_EQ(m.by_use[static_cast<int>(sched::MemoryUse::kOptimizerState)].current, state)
          << when;
      EXPECT_EQ(m.by_use[static_cast<int>(sched::MemoryUse::kStaging)].current, staging + stats)
          << when;
      EXPECT_EQ(m.host.current, state + staging) << when;
      EXPECT_EQ(m.device.current, stats) << when << ": optimizer state on the device";
    };
    check("after Create");
    // The staging buffers are the device's pinned host memory (cudaMallocHost), this rank's
    // two per bucket at least (the other ranks' may be live too); ExpectClean sees them freed
    // with cudaFreeHost (the fake flags any other free).
    EXPECT_GE(gpu.cuda->live_pinned_host(),
              2 * static_cast<int>((*st)->reducer->plan().buckets().size()));
    ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, s, 0, 2));
    check("after 2 steps");
  });
  ExpectClean(gpu);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, NcclOffloadMemoryTest,
    ::testing::Values(
        NamedScenario{"AdamW_RS2_bf16", Offloaded(1, 2, OptimizerKind::kAdamW, DType::kBF16)},
        NamedScenario{"Sgd_RS4_f32", Offloaded(1, 4, OptimizerKind::kSgd, DType::kF32)},
        NamedScenario{"AdamW_Hybrid2x2_f32", Offloaded(2, 2, OptimizerKind::kAdamW, DType::kF32)},
        NamedScenario{"Sgd_Hybrid2x2_bf16", Offloaded(2, 2, OptimizerKind::kSgd, DType::kBF16)}),
    [](const ::testing::TestParamInfo<NamedScenario>& i) { return i.param.name; });

std::string FileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// One format: after the same steps an offloaded and a device optimizer write identical files;
// the offloaded file loads into a device optimizer whose next save is that file again, and the
// device file loads into an offloaded optimizer that resumes bit for bit. Then a Load into the
// same offloaded optimizer after further steps (its last step's copy out of the parameter
// staging buffer still queued) rewinds it, and the steps after it match the reference again.
class NcclOffloadStateTest : public ::testing::TestWithParam<NamedScenario> {};

TEST_P(NcclOffloadStateTest, SameFileFormatBothWays) {
  const OptScenario off = GetParam().s;
  OptScenario dev = off;
  dev.opt.offload = false;
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", GetParam().name);
  ASSERT_EQ(system(absl::StrCat("mkdir -p '", dir, "'").c_str()), 0);
  RunFakeRanks(gpu, off.replicas * off.shards, FakeConfig(), [&](NcclGroup& world) {
    const std::string off_file = absl::StrCat(dir, "/off_rank", world.rank(), ".braid");
    const std::string dev_file = absl::StrCat(dir, "/dev_rank", world.rank(), ".braid");
    const std::string again = absl::StrCat(dir, "/again_rank", world.rank(), ".braid");
    {
      auto st = BuildDeviceStack(world, kernels, off);
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, off, 0, 2));
      ASSERT_OK((*st)->opt->Save(off_file));
    }
    {
      auto st = BuildDeviceStack(world, kernels, dev);
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, dev, 0, 2));
      ASSERT_OK((*st)->opt->Save(dev_file));
    }
    const std::string off_bytes = FileBytes(off_file);
    ASSERT_FALSE(off_bytes.empty());
    EXPECT_TRUE(off_bytes == FileBytes(dev_file)) << "offloaded and device state files differ";
    {  // offloaded file -> device optimizer -> the same file, then it resumes
      auto st = BuildDeviceStack(world, kernels, dev);
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK((*st)->opt->Load(off_file));
      ASSERT_OK((*st)->opt->Save(again));
      EXPECT_TRUE(off_bytes == FileBytes(again))
          << "offloaded file -> device optimizer -> another file";
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, dev, 2, 3));
    }
    {  // device file -> offloaded optimizer: same file back, resumes; then a Load after steps
      auto st = BuildDeviceStack(world, kernels, off);
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK((*st)->opt->Load(dev_file));
      ASSERT_OK((*st)->opt->Save(again));
      EXPECT_TRUE(off_bytes == FileBytes(again))
          << "device file -> offloaded optimizer -> another file";
      ASSERT_OK((*st)->opt->WaitAllParams());
      auto p = DeviceParams(**st, gpu.cuda, off);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(*p, optim::testing::ReferenceParams(off, 2));
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, off, 2, 3));
      ASSERT_OK((*st)->opt->Load(off_file));  // back to step 2 on the same optimizer
      ASSERT_OK((*st)->opt->WaitAllParams());
      p = DeviceParams(**st, gpu.cuda, off);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(*p, optim::testing::ReferenceParams(off, 2));
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, off, 2, 3));
    }
  });
  ExpectClean(gpu);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, NcclOffloadStateTest,
    ::testing::Values(
        NamedScenario{"AdamW_RS2_bf16", Offloaded(1, 2, OptimizerKind::kAdamW, DType::kBF16)},
        NamedScenario{"Sgd_Hybrid2x2_f32", Offloaded(2, 2, OptimizerKind::kSgd, DType::kF32)}),
    [](const ::testing::TestParamInfo<NamedScenario>& i) { return i.param.name; });

// Fully sharded (fully_sharded on) with offload: the step only writes each bucket's shard
// (host step, host -> device copy); a gatherer of the shard first takes WaitShard's event (what
// the unit scheduler's before_gather does), then gathers. The gathered parameters match the
// reference after every step.
TEST(NcclOffloadFullyShardedTest, WaitShardThenGather) {
  for (const OptScenario& base : {Offloaded(1, 2, OptimizerKind::kAdamW, DType::kBF16),
                                  Offloaded(2, 2, OptimizerKind::kSgd, DType::kF32)}) {
    OptScenario s = base;
    s.opt.fully_sharded = true;
    FakeGpu gpu;
    auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
    RunFakeRanks(gpu, s.replicas * s.shards, FakeConfig(), [&](NcclGroup& world) {
      auto st = BuildDeviceStack(world, kernels, s);
      ASSERT_TRUE(st.ok()) << st.status();
      auto& stack = **st;
      for (int t = 0; t < s.steps; ++t) {
        ASSERT_OK(RunDeviceSteps(stack, gpu.cuda, s, t, t + 1, absl::Seconds(60), true,
                                 /*compare=*/false));
        const int buckets = static_cast<int>(stack.reducer->plan().buckets().size());
        for (int b = 0; b < buckets; ++b) {
          DeviceEvent ready;
          ASSERT_OK(stack.opt->WaitShard(b, &ready));
          EXPECT_TRUE(static_cast<bool>(ready.handle))
              << "bucket " << b << ": no step event on the device";
          ASSERT_OK(stack.gatherer->Prefetch(b, ready));
        }
        for (int b = 0; b < buckets; ++b) ASSERT_OK(stack.gatherer->WaitParams(b));
        auto p = DeviceParams(stack, gpu.cuda, s);
        ASSERT_TRUE(p.ok()) << p.status();
        EXPECT_EQ(*p, optim::testing::ReferenceParams(s, t + 1))
            << "rank " << world.rank() << ", step " << t;
      }
    });
    ExpectClean(gpu);
    EXPECT_EQ(kernels->launches(), 0);
  }
}

}  // namespace
}  // namespace braid::nccl::testing
