// ShardedOptimizer on the `nccl` backend's fake device (fake_gpu.h): reducer, gatherer and
// optimizer on device buffers, the step queued on the shard group's comm stream by
// FakeStepKernels (adamw_math.h's rules on the fake stream), the all-gather on the gatherer's
// stream waiting on the step's event. Compared bit for bit after every step with the serial
// unsharded reference of tests/optim (reduce-scatter on 2 and 4 ranks, hybrid 2 x 2; AdamW and
// SGD; f32 and bf16; no_sync windows; overlap on and off; global-norm clipping active and
// inactive and skip_nonfinite with inf / NaN in one rank's gradient, through the fake norm
// kernel, with the step report checked against the reference's norm).
#include <atomic>
#include <limits>
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

NamedScenario Make(const std::string& name, int replicas, int shards, OptimizerKind kind,
                   DType dtype, std::vector<SyncMode> schedule, bool overlap = true) {
  OptScenario s = TwoGroupScenario(replicas, shards);
  s.opt.kind = kind;
  s.dtype = dtype;
  s.schedule = std::move(schedule);
  s.opt.overlap = overlap;
  s.steps = 3;
  return {name, s};
}

NamedScenario Clip(NamedScenario c, double max_norm) {
  c.s.opt.max_grad_norm = max_norm;  // 0.5: active (the norm is ~5-10); 1e6: inactive
  return c;
}

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// ZeRO-Offload: the f32 state in host memory, stepped by the CPU kernels.
NamedScenario Offload(NamedScenario c) {
  c.name += "_Offload";
  c.s.opt.offload = true;
  return c;
}

// skip_nonfinite, with the last rank's gradient holding `bad` at step `step` (every rank skips).
NamedScenario Skip(NamedScenario c, float bad, int step) {
  c.s.opt.skip_nonfinite = true;
  c.s.inf_step = step;
  c.s.bad_value = bad;
  return c;
}

// Divergent control flow: ranks use different parameters; the reducer agrees on use (the
// map's all-reduce in device memory) and the device step skips what no rank used.
NamedScenario Divergent(NamedScenario c, sched::UnusedAgreement how) {
  c.name += how == sched::UnusedAgreement::kDeclared ? "_DivergentDeclared" : "_DivergentAtFinish";
  c.s.agree = how;
  c.s.steps = 4;  // parameter 3: unused by every rank in steps 1 and 3
  return c;
}

class NcclOptimizerTest : public ::testing::TestWithParam<NamedScenario> {};

TEST_P(NcclOptimizerTest, MatchesSerialReference) {
  const OptScenario& s = GetParam().s;
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  RunFakeRanks(gpu, s.replicas * s.shards, FakeConfig(), [&](NcclGroup& world) {
    const absl::Status st = RunDeviceOptimizer(world, gpu.cuda, kernels, s);
    EXPECT_TRUE(st.ok()) << "rank " << world.rank() << ": " << st;
  });
  ExpectClean(gpu);
  // The steps ran as device kernels, or (offload) on the host.
  EXPECT_EQ(kernels->launches() > 0, !s.opt.offload) << kernels->launches();
  const bool global = s.opt.max_grad_norm > 0 || s.opt.skip_nonfinite;
  EXPECT_EQ(kernels->norm_launches() > 0, global);  // the norm too, when needed
}

const SyncMode kS = SyncMode::kSync, kN = SyncMode::kNoSync;
INSTANTIATE_TEST_SUITE_P(
    Scenarios, NcclOptimizerTest,
    ::testing::Values(
        Make("AdamW_RS2_f32", 1, 2, OptimizerKind::kAdamW, DType::kF32, {kS}),
        Make("AdamW_RS4_bf16_NoSync", 1, 4, OptimizerKind::kAdamW, DType::kBF16, {kN, kS}),
        Make("AdamW_Hybrid2x2_f32_NoSync", 2, 2, OptimizerKind::kAdamW, DType::kF32, {kN, kS}),
        Make("AdamW_Hybrid2x2_bf16", 2, 2, OptimizerKind::kAdamW, DType::kBF16, {kS}),
        Make("Sgd_RS4_f32_NoSync", 1, 4, OptimizerKind::kSgd, DType::kF32, {kN, kS}),
        Make("Sgd_RS2_bf16", 1, 2, OptimizerKind::kSgd, DType::kBF16, {kS}),
        Make("Sgd_Hybrid2x2_bf16_NoSync", 2, 2, OptimizerKind::kSgd, DType::kBF16, {kN, kS}),
        Make("AdamW_RS2_f32_NoOverlap", 1, 2, OptimizerKind::kAdamW, DType::kF32, {kS}, false),
        // Global-norm clipping and skip_nonfinite on device (the norm's block sums
        // on the stream, the agreement all-reduce in device memory).
        Clip(Make("Clip_RS2_f32", 1, 2, OptimizerKind::kAdamW, DType::kF32, {kS}), 0.5),
        Clip(Make("Clip_RS4_bf16_NoSync", 1, 4, OptimizerKind::kAdamW, DType::kBF16, {kN, kS}),
             0.5),
        Clip(Make("Clip_Hybrid2x2_f32", 2, 2, OptimizerKind::kAdamW, DType::kF32, {kS}), 0.5),
        Clip(Make("Clip_Hybrid2x2_bf16_Sgd", 2, 2, OptimizerKind::kSgd, DType::kBF16, {kS}), 0.5),
        Clip(Make("ClipInactive_RS2_bf16", 1, 2, OptimizerKind::kAdamW, DType::kBF16, {kS}), 1e6),
        Clip(Make("ClipInactive_Hybrid2x2_f32", 2, 2, OptimizerKind::kAdamW, DType::kF32, {kS}),
             1e6),
        Skip(Make("SkipInf_RS2_f32", 1, 2, OptimizerKind::kAdamW, DType::kF32, {kS}), kInf, 1),
        Skip(Make("SkipNaN_RS4_bf16_LastStep", 1, 4, OptimizerKind::kAdamW, DType::kBF16, {kS}),
             kNaN, 2),
        Skip(Clip(Make("SkipInf_Clip_Hybrid2x2_bf16", 2, 2, OptimizerKind::kAdamW, DType::kBF16,
                       {kN, kS}),
                  0.5),
             kInf, 1),
        Skip(Make("SkipNaN_Hybrid2x2_f32_NoOverlap", 2, 2, OptimizerKind::kAdamW, DType::kF32, {kS},
                  false),
             kNaN, 0),
        Skip(Make("SkipInf_RS2_bf16_Sgd", 1, 2, OptimizerKind::kSgd, DType::kBF16, {kS}), kInf, 1),
        // Offload: host state, device norms, the same bits.
        Offload(Make("AdamW_RS2_f32", 1, 2, OptimizerKind::kAdamW, DType::kF32, {kS})),
        Offload(Make("AdamW_RS4_bf16_NoSync", 1, 4, OptimizerKind::kAdamW, DType::kBF16, {kN, kS})),
        Offload(Make("AdamW_Hybrid2x2_bf16", 2, 2, OptimizerKind::kAdamW, DType::kBF16, {kS})),
        Offload(Make("Sgd_Hybrid2x2_f32_NoSync", 2, 2, OptimizerKind::kSgd, DType::kF32, {kN, kS})),
        Offload(Make("Sgd_RS2_bf16", 1, 2, OptimizerKind::kSgd, DType::kBF16, {kS})),
        Offload(Clip(Make("Clip_Hybrid2x2_f32", 2, 2, OptimizerKind::kAdamW, DType::kF32, {kS}),
                     0.5)),
        Offload(Skip(Make("SkipNaN_RS2_bf16", 1, 2, OptimizerKind::kAdamW, DType::kBF16, {kS}),
                     kNaN, 1)),
        Divergent(Make("AdamW_RS2_f32", 1, 2, OptimizerKind::kAdamW, DType::kF32, {kS}),
                  sched::UnusedAgreement::kDeclared),
        Divergent(Make("AdamW_Hybrid2x2_bf16_NoSync", 2, 2, OptimizerKind::kAdamW, DType::kBF16,
                       {kN, kS}),
                  sched::UnusedAgreement::kAtFinish),
        Divergent(Clip(Make("Sgd_Hybrid2x2_f32", 2, 2, OptimizerKind::kSgd, DType::kF32, {kS}),
                       0.5),
                  sched::UnusedAgreement::kDeclared),
        Divergent(Offload(Make("AdamW_RS4_f32", 1, 4, OptimizerKind::kAdamW, DType::kF32, {kS})),
                  sched::UnusedAgreement::kDeclared)),
    [](const ::testing::TestParamInfo<NamedScenario>& i) { return i.param.name; });

// Offload's memory is the host's (device optimizer state 0; host: master, m and v of every
// bucket's shard), and its state files move both ways between offloaded and device optimizers,
// resuming bit for bit.
TEST(NcclOptimizerOffloadTest, HostStateAndCheckpointsBothWays) {
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  const std::string dir = ::testing::TempDir();
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    sched::MemoryStats memory;
    OptScenario off = TwoGroupScenario(1, 2);
    off.dtype = DType::kBF16;
    off.steps = 4;
    off.opt.offload = true;
    off.opt.memory = &memory;
    OptScenario dev = off;
    dev.opt.offload = false;
    dev.opt.memory = nullptr;
    const std::string path = absl::StrCat(dir, "/offload_rank", world.rank(), ".braid");
    const std::string back = absl::StrCat(dir, "/device_rank", world.rank(), ".braid");
    {
      auto st = BuildDeviceStack(world, kernels, off);
      ASSERT_TRUE(st.ok()) << st.status();
      const sched::MemorySnapshot m = memory.Snapshot();
      int64_t floats = 0;
      for (const sched::Bucket& b : (*st)->reducer->plan().buckets()) {
        floats += static_cast<int64_t>(std::max<size_t>(64, (b.shard_count * 4 + 63) / 64 * 64));
      }
      EXPECT_EQ(m.by_use[static_cast<int>(sched::MemoryUse::kOptimizerState)].current, 3 * floats);
      // On the device only the statistics all-reduce's 2 doubles (the reducer and gatherer were
      // given no stats): no optimizer state.
      EXPECT_EQ(m.device.current, static_cast<int64_t>(2 * sizeof(double)));
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, off, 0, 2));
      ASSERT_OK((*st)->opt->Save(path));
    }
    {  // offloaded file -> device optimizer, steps 2..3 against the reference
      auto st = BuildDeviceStack(world, kernels, dev);
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK((*st)->opt->Load(path));
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, dev, 2, 3));
      ASSERT_OK((*st)->opt->Save(back));
    }
    {  // device file -> offloaded optimizer, step 3 against the reference
      auto st = BuildDeviceStack(world, kernels, off);
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK((*st)->opt->Load(back));
      ASSERT_OK((*st)->opt->WaitAllParams());
      auto p = DeviceParams(**st, gpu.cuda, off);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(*p, optim::testing::ReferenceParams(off, 3));
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, off, 3, 4));
    }
  });
  ExpectClean(gpu);
}

// Control: without readiness events the reductions read gradients before the compute stream
// wrote them (the fake runs a stream's work only when something waits on it), and the same
// comparison fails on every rank.
TEST(NcclOptimizerControlTest, NoReadyEventsIsStale) {
  const NamedScenario c = Make("control", 2, 2, OptimizerKind::kAdamW, DType::kF32, {kS});
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  std::atomic<int> stale{0};
  RunFakeRanks(gpu, 4, FakeConfig(), [&](NcclGroup& world) {
    if (!RunDeviceOptimizer(world, gpu.cuda, kernels, c.s, absl::Seconds(60), /*pass_events=*/false)
             .ok())
      ++stale;
  });
  EXPECT_EQ(stale.load(), 4);
}

TEST(NcclOptimizerErrorsTest, DeviceKernelsRequired) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    const absl::Status st = RunDeviceOptimizer(world, gpu.cuda, nullptr, TwoGroupScenario(1, 2));
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_NE(std::string(st.message()).find("device_kernels"), std::string::npos) << st;
  });
  ExpectClean(gpu);
}

// Step kernels without a norm kernel (DeviceStepKernels' default NormBlockSums).
class NoNormKernels final : public optim::DeviceStepKernels {
 public:
  explicit NoNormKernels(std::shared_ptr<FakeStepKernels> k) : k_(std::move(k)) {}
  absl::Status AdamW(const optim::AdamWScalars& s, float* p, float* m, float* v, const void* grad,
                     DType gt, size_t n, void* out, DType ot, DeviceStream stream) override {
    return k_->AdamW(s, p, m, v, grad, gt, n, out, ot, stream);
  }
  absl::Status Sgd(const optim::SgdScalars& s, float* p, float* buf, const void* grad, DType gt,
                   size_t n, void* out, DType ot, DeviceStream stream) override {
    return k_->Sgd(s, p, buf, grad, gt, n, out, ot, stream);
  }

 private:
  std::shared_ptr<FakeStepKernels> k_;
};

// Only the last rank cannot take its norm: the failure is agreed on through the statistics
// all-reduce, so every rank drops the clipped step (nothing hangs), that rank's error names the
// kernel and the bucket, the others' name the failed peer, and no parameter changes anywhere.
// Two steps: both dropped the same way.
TEST(NcclOptimizerErrorsTest, OneRanksNormFailureDropsTheStepOnEveryRank) {
  FakeGpu gpu;
  auto good = std::make_shared<FakeStepKernels>(gpu.cuda);
  auto bad = std::make_shared<NoNormKernels>(std::make_shared<FakeStepKernels>(gpu.cuda));
  OptScenario s = TwoGroupScenario(1, 2);
  s.opt.max_grad_norm = 0.5;
  const auto initial = optim::testing::ReferenceParams(s, 0);
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    const bool failing = world.rank() == 1;
    std::shared_ptr<optim::DeviceStepKernels> kernels = good;
    if (failing) kernels = bad;
    auto st = BuildDeviceStack(world, kernels, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_TRUE(
        RunDeviceSteps(**st, gpu.cuda, s, 0, 2, absl::Seconds(60), true, /*compare=*/false).ok());
    const absl::Status err = (*st)->opt->last_step().error;
    if (failing) {
      EXPECT_TRUE(absl::IsUnimplemented(err)) << err;
      for (const char* want : {"NormBlockSums", "gradient norm of bucket 0", "dropped"}) {
        EXPECT_NE(std::string(err.message()).find(want), std::string::npos)
            << want << " in " << err;
      }
    } else {
      EXPECT_TRUE(absl::IsAborted(err)) << err;
      EXPECT_NE(std::string(err.message()).find("1 other rank(s)"), std::string::npos) << err;
    }
    auto got = DeviceParams(**st, gpu.cuda, s);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, initial) << "rank " << world.rank() << ": a dropped step changed parameters";
    EXPECT_EQ((*st)->opt->bucket_steps(0), 0);
    EXPECT_EQ((*st)->opt->last_step().rounds, 2);
  });
  EXPECT_GT(good->norm_launches(), 0);
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
