// The GradientReducer end to end on a real GPU: a single-rank `nccl` world (NCCL allows one
// rank per device), bucket storage in device memory, gradients copied in on a compute stream
// and marked ready with events recorded there, every bucket operation on the comm streams,
// results read back and compared bit for bit with the serial reference. All-reduce,
// reduce-scatter and hybrid (1 x 1 mesh), f32 and bf16 reduced in f32, no_sync, copy-in.
// Multi-rank arithmetic is covered on the fake device (nccl_reducer_test); this checks the
// real runtime, the real cast kernel and real stream semantics. Skips without a GPU (CUDA
// error 35 or 100).
//
//   tools/bazelw test //tests/nccl:nccl_reducer_gpu_test --test_output=all
#include <cuda_runtime.h>

#include <memory>

#include "backends/nccl/errors.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/nccl/unique_id.h"
#include "gtest/gtest.h"
#include "tests/nccl/device_reducer_driver.h"

namespace braid::nccl::testing {
namespace {

using sched::ReduceMode;
using sched::reference::Scenario;
using sched::reference::ScenarioName;

class NcclReducerGpuTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(NcclReducerGpuTest, MatchesSerialReference) {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (IsNoDevice(rc)) {
    GTEST_SKIP() << "no GPU: " << cudaGetErrorString(rc) << " (" << static_cast<int>(rc) << ")";
  }
  ASSERT_EQ(rc, cudaSuccess) << cudaGetErrorString(rc);
  if (n == 0) GTEST_SKIP() << "no GPU: device count 0";
  auto id = NewUniqueIdBytes(*RealNcclApi());
  ASSERT_TRUE(id.ok()) << id.status();
  NcclBackendConfig cfg;
  cfg.timeout = absl::Seconds(60);
  const NcclApis apis = RealApis();
  auto backend = NcclBackend::CreateFromUniqueId(apis, *id, 1, 0, cfg);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto world = (*backend)->WorldGroup(0);
  ASSERT_TRUE(world.ok()) << world.status();
  const absl::Status s = RunDeviceScenario(**world, apis.cuda, GetParam(), ExactGrad, absl::Seconds(60));
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(
    Modes, NcclReducerGpuTest,
    ::testing::Values(Scenario{ReduceMode::kAllReduce, 1, 1, 0, "NS"},
                      Scenario{ReduceMode::kAllReduce, 1, 1, 1, "NS", false, true},
                      Scenario{ReduceMode::kAllReduce, 1, 1, 0, "NS", true},
                      Scenario{ReduceMode::kReduceScatter, 1, 1, 0, "NS"},
                      Scenario{ReduceMode::kReduceScatter, 1, 1, 1, "NS", false, true},
                      Scenario{ReduceMode::kHybrid, 1, 1, 0, "NS"},
                      Scenario{ReduceMode::kHybrid, 1, 1, 1, "NNS", false, true}),
    [](const ::testing::TestParamInfo<Scenario>& i) { return ScenarioName(i.param); });

}  // namespace
}  // namespace braid::nccl::testing
