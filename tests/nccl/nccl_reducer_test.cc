// GradientReducer on the `nccl` backend's fake device (fake_gpu.h): bucket storage in "device"
// memory, every bucket operation queued on the groups' comm streams (NcclBufferOps), gradients
// written on a compute stream and marked ready with events recorded there. Results are read
// back and compared bit for bit with the serial reference of the CPU reducer tests.
// The fake runs a stream's work only when something waits on it, so a reduction that does not
// wait on the readiness events reads the gradients before the producer's writes: the
// NoReadyEvents* control shows this test would see that.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/mesh.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/op_scheduler.h"
#include "tests/multirank.h"
#include "tests/nccl/device_reducer_driver.h"
#include "tests/nccl/fake_gpu.h"

namespace braid::nccl::testing {
namespace {

using sched::ReduceMode;
using sched::reference::Scenario;
using sched::reference::ScenarioName;

class NcclReducerTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(NcclReducerTest, MatchesSerialReference) {
  const Scenario sc = GetParam();
  FakeGpu gpu;
  RunFakeRanks(gpu, sc.replicas * sc.shards, FakeConfig(), [&](NcclGroup& world) {
    const absl::Status s = RunDeviceScenario(world, gpu.cuda, sc, ExactGrad, absl::Seconds(60));
    EXPECT_TRUE(s.ok()) << "rank " << world.rank() << ": " << s;
  });
  ExpectClean(gpu);
  // The bucket operations ran on the device, through the stream-ordered interface.
  bool memset = false, waits = false;
  for (const std::string& line : gpu.cuda->log()) {
    memset |= line.rfind("MemsetAsync(", 0) == 0;
    waits |= line.rfind("StreamWaitEvent(", 0) == 0;
  }
  EXPECT_TRUE(memset);
  EXPECT_TRUE(waits);
  if (sc.reduce_f32) {
    EXPECT_GT(gpu.kernels->launches(), 0);
  }
  // f16 reduced natively over a group of 4 or more: the post-divide ran as a scaled cast.
  const bool f16_post = (sc.dtypes == 2 || sc.dtypes == 3) && !sc.reduce_f32 &&
                        ((sc.mode == ReduceMode::kHybrid ? std::max(sc.shards, sc.replicas)
                                                         : sc.replicas * sc.shards) >= 4);
  EXPECT_EQ(gpu.kernels->scaled_casts() > 0, f16_post) << gpu.kernels->scaled_casts();
  // reduce_scatter_only: the partial shards were added on the device (two R microbatches or
  // more; one R then S adds the partial into the synced shard).
  const bool adds = std::strchr(sc.schedule, 'R') != nullptr;
  EXPECT_EQ(gpu.kernels->adds() > 0, adds) << gpu.kernels->adds();
}

// Gradients passed at MarkReady (copied / added on the comm stream after the readiness event),
// and shard_gradients (pooled storage, kept shards; hybrid's replica all-reduce on the kept
// shard after the shard stream's copy): the fake runs a stream's work only when waited on, so
// a missing wait reads stale data.
class NcclReducerValuesTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(NcclReducerValuesTest, MatchesSerialReference) {
  const Scenario sc = GetParam();
  FakeGpu gpu;
  RunFakeRanks(gpu, sc.replicas * sc.shards, FakeConfig(), [&](NcclGroup& world) {
    const absl::Status s = RunDeviceScenario(world, gpu.cuda, sc, ExactGrad, absl::Seconds(60));
    EXPECT_TRUE(s.ok()) << "rank " << world.rank() << ": " << s;
  });
  ExpectClean(gpu);
}

Scenario Values(Scenario sc, bool kept) {
  sc.values = true;
  sc.shard_gradients = kept;
  return sc;
}

INSTANTIATE_TEST_SUITE_P(
    Values, NcclReducerValuesTest,
    ::testing::Values(
        Values(Scenario{ReduceMode::kAllReduce, 1, 2, 0, "NS"}, false),
        Values(Scenario{ReduceMode::kReduceScatter, 1, 4, 1, "NS", false, true}, false),
        Values(Scenario{ReduceMode::kHybrid, 2, 2, 0, "RNS"}, false),
        Values(Scenario{ReduceMode::kReduceScatter, 1, 2, 0, "S"}, true),
        Values(Scenario{ReduceMode::kReduceScatter, 1, 4, 1, "NNS", false, true}, true),
        Values(Scenario{ReduceMode::kReduceScatter, 1, 4, 2, "NS"}, true),
        Values(Scenario{ReduceMode::kHybrid, 2, 2, 0, "NS"}, true),
        Values(Scenario{ReduceMode::kHybrid, 2, 2, 0, "RRS"}, true),
        Values(Scenario{ReduceMode::kHybrid, 2, 2, 1, "NRNS", false, true}, true),
        Values(Scenario{ReduceMode::kHybrid, 2, 4, 2, "RNS"}, true)),
    [](const ::testing::TestParamInfo<Scenario>& i) { return ScenarioName(i.param); });

// dtypes 0 f32, 1 bf16, 2 f16, 3 mixed; "NS": a no_sync microbatch, then a synced one; "R": a
// reduce_scatter_only microbatch (hybrid).
INSTANTIATE_TEST_SUITE_P(
    Modes, NcclReducerTest,
    ::testing::Values(Scenario{ReduceMode::kAllReduce, 1, 2, 0, "S"},
                      Scenario{ReduceMode::kAllReduce, 1, 4, 0, "NS"},
                      Scenario{ReduceMode::kAllReduce, 1, 4, 1, "NS", false, true},
                      Scenario{ReduceMode::kAllReduce, 1, 2, 0, "NS", true},
                      Scenario{ReduceMode::kAllReduce, 1, 2, 1, "S", true, true},
                      Scenario{ReduceMode::kReduceScatter, 1, 4, 0, "NS"},
                      Scenario{ReduceMode::kReduceScatter, 1, 4, 1, "NS", false, true},
                      Scenario{ReduceMode::kHybrid, 2, 2, 0, "NS"},
                      Scenario{ReduceMode::kHybrid, 2, 2, 1, "NNS", false, true},
                      // f16 reduced natively: premul 1/2, then the post-divide by 2 on device.
                      Scenario{ReduceMode::kAllReduce, 1, 4, 2, "S"},
                      Scenario{ReduceMode::kAllReduce, 1, 4, 3, "NS", true},
                      Scenario{ReduceMode::kReduceScatter, 1, 4, 2, "NS"},
                      Scenario{ReduceMode::kHybrid, 2, 4, 2, "NS"},
                      Scenario{ReduceMode::kHybrid, 4, 2, 3, "S"},
                      // reduce_scatter_only: partial shards added on the device.
                      Scenario{ReduceMode::kHybrid, 2, 2, 0, "RRS"},
                      Scenario{ReduceMode::kHybrid, 2, 2, 1, "RNRS"},
                      Scenario{ReduceMode::kHybrid, 2, 2, 1, "RRS", false, true},
                      Scenario{ReduceMode::kHybrid, 4, 2, 2, "RRRS"},
                      Scenario{ReduceMode::kHybrid, 2, 4, 3, "RS"}),
    [](const ::testing::TestParamInfo<Scenario>& i) { return ScenarioName(i.param); });

// Credit-sized partitions on the device (scheduler/op_scheduler.h through ReducerConfig::
// scheduler): every bucket above the credit is reduced as several collectives on the comm
// stream (reduce-scatter partitions packed into device staging blocks by stream copies), the
// first after the readiness events, the reduction's Work completed by an event after the last
// one. Same serial reference, bit for bit; the partitions are counted in the fake's log.
class NcclPartitionTest : public ::testing::TestWithParam<Scenario> {};

TEST_P(NcclPartitionTest, MatchesSerialReference) {
  int collectives[2] = {0, 0};  // whole, partitioned
  for (const bool partitioned : {false, true}) {
    Scenario sc = GetParam();
    if (!partitioned) sc.credit = 0;
    FakeGpu gpu;
    RunFakeRanks(gpu, sc.replicas * sc.shards, FakeConfig(), [&](NcclGroup& world) {
      const absl::Status s = RunDeviceScenario(world, gpu.cuda, sc, ExactGrad, absl::Seconds(60));
      EXPECT_TRUE(s.ok()) << "rank " << world.rank() << ": " << s;
    });
    ExpectClean(gpu);
    collectives[partitioned] = gpu.nccl->executed_collectives();
  }
  // The same plan, so every extra collective is a partition.
  EXPECT_GT(collectives[1], collectives[0]);
}

Scenario Credit(Scenario sc, size_t credit) {
  sc.credit = credit;
  return sc;
}

INSTANTIATE_TEST_SUITE_P(
    Partitions, NcclPartitionTest,
    ::testing::Values(
        Credit(Scenario{ReduceMode::kAllReduce, 1, 2, 0, "NS"}, 256),
        Credit(Scenario{ReduceMode::kAllReduce, 1, 4, 3, "NS", true}, 1024),
        Credit(Scenario{ReduceMode::kReduceScatter, 1, 4, 0, "NS"}, 256),
        Credit(Scenario{ReduceMode::kReduceScatter, 1, 2, 2, "NS"}, 1024),
        Credit(Scenario{ReduceMode::kReduceScatter, 1, 4, 1, "NS", false, true}, 256),
        Credit(Values(Scenario{ReduceMode::kReduceScatter, 1, 4, 1, "NNS", false, true}, true),
               256),
        Credit(Scenario{ReduceMode::kHybrid, 2, 2, 0, "RNS"}, 256),
        Credit(Scenario{ReduceMode::kHybrid, 2, 2, 1, "RRS", false, true}, 1024)),
    [](const ::testing::TestParamInfo<Scenario>& i) { return ScenarioName(i.param); });

// The scheduler's own contract on a device group: a partitioned reduction's Work carries a
// device event (recorded after the last partition) for consumer streams, and the values are
// the sums, in place, on every rank.
TEST(NcclSchedulerTest, PartitionedWorkCarriesADeviceEvent) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    sched::OpSchedulerConfig oc;
    oc.credit_bytes = 256;
    auto sch = sched::OpScheduler::Create(oc, &world);
    ASSERT_TRUE(sch.ok()) << sch.status();
    constexpr size_t kCount = 1000;  // 4000 bytes: 16 partitions
    std::vector<float> host(kCount);
    for (size_t i = 0; i < kCount; ++i)
      host[i] = static_cast<float>(world.rank() + 1) * static_cast<float>(i % 17);
    BufferOps& ops = world.buffer_ops();
    auto buf = ops.Allocate(kCount * sizeof(float), "test buffer");
    ASSERT_TRUE(buf.ok()) << buf.status();
    ASSERT_TRUE(ops.Copy(buf->get(), host.data(), kCount * sizeof(float)).ok());
    sched::ReductionRequest r;
    r.group = &world;
    r.send = r.recv = buf->get();
    r.count = kCount;
    r.op = ReduceOp::Sum();
    auto w = (*sch)->SubmitReduction(r);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Wait(absl::Seconds(30)).ok());
    EXPECT_TRUE(static_cast<bool>((*w)->device_event()));
    EXPECT_EQ((*sch)->partitions_issued(), 16);
    ASSERT_TRUE(ops.Copy(host.data(), buf->get(), kCount * sizeof(float)).ok());
    ASSERT_TRUE(ops.Synchronize(absl::Now() + absl::Seconds(30)).ok());
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(host[i], 3.0f * static_cast<float>(i % 17)) << "element " << i;
    }
  });
  ExpectClean(gpu);
}

// Negative control: the same run with MarkReady given no events must fail the comparison (the
// fake runs the producer's writes only once something waits on them).
void ExpectStale(const Scenario& sc) {
  FakeGpu gpu;
  std::atomic<int> stale{0};
  RunFakeRanks(gpu, sc.replicas * sc.shards, FakeConfig(), [&](NcclGroup& world) {
    const absl::Status s = RunDeviceScenario(world, gpu.cuda, sc, ExactGrad, absl::Seconds(60),
                                             /*pass_events=*/false);
    if (!s.ok()) ++stale;
  });
  EXPECT_EQ(stale.load(), sc.replicas * sc.shards);
}

TEST(NcclReducerControlTest, NoReadyEventsAllReduceIsStale) {
  ExpectStale(Scenario{ReduceMode::kAllReduce, 1, 2, 0, "S"});
}
TEST(NcclReducerControlTest, NoReadyEventsF32ReduceIsStale) {
  ExpectStale(Scenario{ReduceMode::kReduceScatter, 1, 2, 1, "S", false, true});
}

// The one-time bucket rebuild on device storage: world rank 0's order is broadcast through a
// staged device buffer, and every gradient moves with its parameter (device copies).
TEST(NcclReducerRebuildTest, GradientsMoveWithTheirParameters) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    sched::ReducerConfig cfg;
    cfg.rebuild_bucket_order = true;
    cfg.first_bucket_cap_bytes = 256;
    cfg.bucket_cap_bytes = 4096;
    std::vector<sched::ParamSpec> params = sched::reference::MakeParams(0);
    for (auto& p : params) p.device = Device{DeviceType::kCuda, 0};
    auto red = sched::GradientReducer::Create(params, {&world, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    sched::GradientReducer& r = **red;
    ASSERT_TRUE(r.BeginBackward(sched::SyncMode::kSync).ok());
    for (size_t p = 0; p < params.size(); ++p) {  // registration order: the reverse of the plan's
      ASSERT_TRUE(r.MarkReady(params[p].id).ok());
    }
    ASSERT_TRUE(r.FinishBackward().ok());
    // Fake device memory is host memory: stamp each gradient with its parameter index.
    for (size_t p = 0; p < params.size(); ++p) {
      auto v = r.GradView(params[p].id);
      ASSERT_TRUE(v.ok());
      for (size_t i = 0; i < v->count; ++i) static_cast<float*>(v->data)[i] = 1000.0f * p + i;
    }
    auto rebuilt = r.RebuildBucketsIfPending();
    ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
    EXPECT_TRUE(*rebuilt);
    for (size_t p = 0; p < params.size(); ++p) {
      auto v = r.GradView(params[p].id);
      ASSERT_TRUE(v.ok());
      for (size_t i = 0; i < v->count; ++i) {
        ASSERT_EQ(static_cast<float*>(v->data)[i], 1000.0f * p + i)
            << params[p].Label() << " [" << i << "]";
      }
    }
  });
  ExpectClean(gpu);
}

TEST(NcclReducerErrorsTest, HostParametersRejectedOnDeviceGroup) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    auto red =
        sched::GradientReducer::Create(sched::reference::MakeParams(0), {&world, nullptr}, {});
    ASSERT_FALSE(red.ok());
    EXPECT_TRUE(absl::IsUnimplemented(red.status())) << red.status();
    EXPECT_NE(std::string(red.status().message()).find("layer"), std::string::npos) << red.status();
  });
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
