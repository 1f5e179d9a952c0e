// ShardedOptimizer::Save / Load on the fake device (fake_gpu.h): a resumed device run equals the
// uninterrupted one and the serial reference bit for bit (RS and hybrid, AdamW and SGD, f32 and
// bf16); a file saved on device loads on the host (`local` backend) and a host file on device,
// both continuing bit-exactly; Load refuses a corrupt file or another world, changing nothing.
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/nccl/unique_id.h"
#include "gtest/gtest.h"
#include "optim/sharded_optimizer.h"
#include "tests/multirank.h"
#include "tests/nccl/device_optimizer_driver.h"
#include "tests/nccl/fake_gpu.h"
#include "tests/nccl/fake_step_kernels.h"
#include "tests/nccl/forwarding_cuda_api.h"

namespace braid::nccl::testing {
namespace {

using optim::OptimizerKind;
using optim::testing::NamedScenario;
using optim::testing::OptScenario;
using optim::testing::ReferenceParams;
using optim::testing::TwoGroupScenario;

std::string StatePath(const std::string& tag, int rank) {
  return absl::StrCat(::testing::TempDir(), "/", tag, "_rank", rank, ".braid");
}

NamedScenario Make(const std::string& name, int replicas, int shards, OptimizerKind kind,
                   DType dtype, double max_norm = 0) {
  OptScenario s = TwoGroupScenario(replicas, shards);
  s.opt.kind = kind;
  s.dtype = dtype;
  s.opt.max_grad_norm = max_norm;
  s.steps = 4;
  return {name, s};
}

class NcclResumeTest : public ::testing::TestWithParam<NamedScenario> {};

// Steps 0-1, Save, steps 2-3 (uninterrupted); a fresh stack Loads and runs steps 2-3 again.
TEST_P(NcclResumeTest, ResumeOnDeviceIsBitExact) {
  const NamedScenario& c = GetParam();
  const OptScenario& s = c.s;
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  RunFakeRanks(gpu, s.replicas * s.shards, FakeConfig(), [&](NcclGroup& world) {
    const std::string path = StatePath(c.name, world.rank());
    std::vector<std::vector<uint8_t>> uninterrupted;
    {
      auto st = BuildDeviceStack(world, kernels, s);
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, s, 0, 2));
      ASSERT_OK((*st)->opt->Save(path));
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, s, 2, 4));
      auto p = DeviceParams(**st, gpu.cuda, s);
      ASSERT_TRUE(p.ok()) << p.status();
      uninterrupted = *p;
    }
    auto st = BuildDeviceStack(world, kernels, s);  // fresh: initial weights, zero moments
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK((*st)->opt->Load(path));
    ASSERT_OK((*st)->opt->WaitAllParams());
    auto loaded = DeviceParams(**st, gpu.cuda, s);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(*loaded, ReferenceParams(s, 2))
        << "rank " << world.rank() << ": parameters right after Load";
    ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, s, 2, 4));  // compares with the reference each step
    auto resumed = DeviceParams(**st, gpu.cuda, s);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(*resumed, uninterrupted);
    EXPECT_EQ((*st)->opt->last_step().rounds, 4);
    EXPECT_EQ((*st)->opt->bucket_steps(0), 4);
  });
  ExpectClean(gpu);
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, NcclResumeTest,
    ::testing::Values(Make("AdamW_RS2_f32", 1, 2, OptimizerKind::kAdamW, DType::kF32),
                      Make("AdamW_Hybrid2x2_bf16_Clip", 2, 2, OptimizerKind::kAdamW, DType::kBF16,
                           0.5),
                      Make("Sgd_RS4_bf16", 1, 4, OptimizerKind::kSgd, DType::kBF16)),
    [](const ::testing::TestParamInfo<NamedScenario>& i) { return i.param.name; });

// Device Save -> host Load (local backend) -> host steps, and host Save -> device Load -> device
// steps: the same file format and layout fingerprint, and both continue on the reference.
TEST(NcclStateCrossTest, DeviceFilesLoadOnHostAndHostFilesOnDevice) {
  const NamedScenario c = Make("cross", 2, 2, OptimizerKind::kAdamW, DType::kBF16);
  const OptScenario& s = c.s;
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  RunFakeRanks(gpu, 4, FakeConfig(), [&](NcclGroup& world) {
    auto st = BuildDeviceStack(world, kernels, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, s, 0, 1));
    ASSERT_OK((*st)->opt->Save(StatePath("device_saved", world.rank())));
  });
  braid::testing::RunRanks(4, [&](Group& world) {
    auto st = optim::testing::BuildStack(world, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK((*st)->opt->Load(StatePath("device_saved", world.rank())));
    ASSERT_OK((*st)->opt->WaitAllParams());
    EXPECT_EQ(optim::testing::Params(**st, s).value(), ReferenceParams(s, 1))
        << "host after device file";
    ASSERT_OK(optim::testing::RunSteps(**st, s, 1, 2));
    EXPECT_EQ(optim::testing::Params(**st, s).value(), ReferenceParams(s, 2));
    ASSERT_OK((*st)->opt->Save(StatePath("host_saved", world.rank())));
  });
  RunFakeRanks(gpu, 4, FakeConfig(), [&](NcclGroup& world) {
    auto st = BuildDeviceStack(world, kernels, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK((*st)->opt->Load(StatePath("host_saved", world.rank())));
    ASSERT_OK((*st)->opt->WaitAllParams());
    ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, s, 2, 4));  // compared with the reference each step
    EXPECT_EQ((*st)->opt->last_step().rounds, 4);
  });
  ExpectClean(gpu);
}

// A corrupt file on one rank: every rank refuses (DataLoss there, FailedPrecondition naming the
// others elsewhere), nothing changes on any rank and training continues on the reference; a file
// of another world is refused by name.
TEST(NcclStateErrorsTest, LoadRefusesCorruptFilesAndOtherWorldsChangingNothing) {
  const NamedScenario c = Make("errors", 1, 2, OptimizerKind::kAdamW, DType::kF32);
  const OptScenario& s = c.s;
  OptScenario one = s;
  one.shards = 1;
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  RunFakeRanks(gpu, 1, FakeConfig(), [&](NcclGroup& world) {
    auto st = BuildDeviceStack(world, kernels, one);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK((*st)->opt->Save(StatePath("world1", 0)));
  });
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    auto st = BuildDeviceStack(world, kernels, s);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, s, 0, 1));
    const std::string good = StatePath("errors_good", world.rank());
    ASSERT_OK((*st)->opt->Save(good));
    ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, s, 1, 2));
    // Rank 1's file loses a byte in the middle of its payload.
    if (world.rank() == 1) {
      FILE* f = std::fopen(good.c_str(), "r+b");
      ASSERT_NE(f, nullptr);
      std::fseek(f, 200, SEEK_SET);
      const int ch = std::fgetc(f);
      std::fseek(f, 200, SEEK_SET);
      std::fputc(ch ^ 0x5a, f);
      std::fclose(f);
    }
    auto w = world.Barrier();
    ASSERT_TRUE(w.ok());
    ASSERT_OK((*w)->Wait(absl::Seconds(30)));
    const absl::Status bad = (*st)->opt->Load(good);
    if (world.rank() == 1) {
      braid::testing::ExpectError(bad, absl::StatusCode::kDataLoss, {good});
    } else {
      braid::testing::ExpectError(bad, absl::StatusCode::kFailedPrecondition,
                                  {"other rank", "nothing was loaded"});
    }
    const absl::Status other = (*st)->opt->Load(StatePath("world1", 0));
    braid::testing::ExpectError(other, absl::StatusCode::kFailedPrecondition,
                                {"world size 1", "has 2"});
    auto p = DeviceParams(**st, gpu.cuda, s);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(*p, ReferenceParams(s, 2))
        << "rank " << world.rank() << ": a failed Load changed parameters";
    ASSERT_OK(
        RunDeviceSteps(**st, gpu.cuda, s, 2, 3));  // the state is intact: still on the reference
  });
  ExpectClean(gpu);
}

// Fails every copy larger than a stats exchange once armed (Load's copies of the state to the
// device), leaving the 16-byte agreement copies alone.
class FailingCopyCuda final : public ForwardingCudaApi {
 public:
  using ForwardingCudaApi::ForwardingCudaApi;
  cudaError_t MemcpyAsync(void* d, const void* src, size_t n, cudaMemcpyKind k,
                          cudaStream_t st) override {
    if (armed.load() && n > 64) return cudaErrorInvalidValue;
    return ForwardingCudaApi::MemcpyAsync(d, src, n, k, st);
  }
  std::atomic<bool> armed{false};
};

// Rank 1's copies of the loaded state to the device fail: both ranks return (rank 1 naming the
// copy, rank 0 the other rank) and neither re-gathers alone, so nobody waits for a gather that
// its peer never issues.
TEST(NcclStateErrorsTest, AFailedDeviceCopyOnOneRankFailsLoadOnEveryRank) {
  OptScenario s = TwoGroupScenario(1, 2);
  s.steps = 2;
  FakeGpu gpu;
  auto kernels = std::make_shared<FakeStepKernels>(gpu.cuda);
  std::vector<std::shared_ptr<FailingCopyCuda>> cuda;
  for (int r = 0; r < 2; ++r) cuda.push_back(std::make_shared<FailingCopyCuda>(gpu.cuda));
  absl::StatusOr<std::string> id = NewUniqueIdBytes(*gpu.nccl);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<absl::Status> loaded(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto backend = NcclBackend::CreateFromUniqueId(NcclApis{cuda[r], gpu.nccl, gpu.kernels}, *id,
                                                     2, r, FakeConfig(true, absl::Seconds(20)));
      ASSERT_TRUE(backend.ok()) << backend.status();
      auto world = (*backend)->WorldGroup(r);
      ASSERT_TRUE(world.ok()) << world.status();
      auto st = BuildDeviceStack(**world, kernels, s, absl::Seconds(20));
      ASSERT_TRUE(st.ok()) << st.status();
      ASSERT_OK(RunDeviceSteps(**st, gpu.cuda, s, 0, 1));
      const std::string path = StatePath("copy_fails", r);
      ASSERT_OK((*st)->opt->Save(path));
      if (r == 1) cuda[r]->armed = true;
      loaded[r] = (*st)->opt->Load(path);
      cuda[r]->armed = false;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(loaded[1].message().find("copying the state of"), absl::string_view::npos) << loaded[1];
  EXPECT_EQ(loaded[0].code(), absl::StatusCode::kAborted) << loaded[0];
  EXPECT_NE(loaded[0].message().find("1 other rank(s) failed to copy"), absl::string_view::npos)
      << loaded[0];
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
