// ZeroGrads / ZeroGradsAsync on device buckets (gradients as bucket views), on the fake device:
// the zeroing is a memset queued on the comm stream, and the framework's next writes come from
// its own compute stream. The test makes the compute stream run ahead of the comm stream (it
// stalls the fake's event queries while queuing, then pumps the compute stream first): the next
// backward's result is the new gradient only if the memset was ordered before the compute
// stream's writes, through ZeroGradsAsync's event or ZeroGrads' host wait. The control that
// skips the event wait sees its gradients zeroed after it wrote them.
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/nccl/cuda_handles.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/unique_id.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "tests/nccl/device_reducer_driver.h"
#include "tests/nccl/fake_gpu.h"
#include "tests/nccl/forwarding_cuda_api.h"
#include "tests/reducer_reference.h"

namespace braid::nccl::testing {
namespace {

enum class Zeroing { kAsyncAndWait, kAsyncNoWait, kHostWait };

std::vector<float> GradOf(int p, size_t n, int microbatch) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>(ExactGrad(0, p, microbatch, 0, i));
  return g;
}

// One rank: a synced backward of gradients g1, the zeroing, then gradients g2 written on the
// compute stream (which runs ahead), a second synced backward. Returns how many elements differ
// from g2 (world size 1: the all-reduce's result is the gradient itself).
absl::StatusOr<size_t> RunZeroing(NcclGroup& world, FakeGpu& gpu, Zeroing how) {
  std::shared_ptr<CudaApi> cuda = gpu.cuda;
  sched::ReducerConfig cfg;
  cfg.first_bucket_cap_bytes = 256;
  cfg.bucket_cap_bytes = 4096;
  std::vector<sched::ParamSpec> params = sched::reference::MakeParams(0);  // f32
  for (auto& p : params) p.device = Device{DeviceType::kCuda, 0};
  ASSIGN_OR_RETURN(std::unique_ptr<sched::GradientReducer> red,
                   sched::GradientReducer::Create(params, {&world, nullptr}, cfg));
  const size_t n = params.size();
  std::vector<std::vector<float>> g1(n), g2(n);
  for (size_t p = 0; p < n; ++p) {
    g1[p] = GradOf(static_cast<int>(p), params[p].count, 0);
    g2[p] = GradOf(static_cast<int>(p), params[p].count, 1);
  }
  std::vector<WorkPtr> zero_works;
  std::vector<CudaEvent> events(n);
  for (auto& e : events) {
    ASSIGN_OR_RETURN(e, CudaEvent::Create(cuda));
  }
  ASSIGN_OR_RETURN(CudaStream compute, CudaStream::Create(cuda, "compute stream"));
  auto write = [&](const std::vector<std::vector<float>>& g) -> absl::Status {
    for (size_t p = 0; p < n; ++p) {
      ASSIGN_OR_RETURN(TensorView v, red->GradView(params[p].id));
      RETURN_IF_ERROR(CudaStatus(*cuda,
                                 cuda->MemcpyAsync(v.data, g[p].data(), g[p].size() * 4,
                                                   cudaMemcpyHostToDevice, compute.get()),
                                 "cudaMemcpyAsync"));
      RETURN_IF_ERROR(
          CudaStatus(*cuda, cuda->EventRecord(events[p].get(), compute.get()), "cudaEventRecord"));
    }
    return absl::OkStatus();
  };
  auto backward = [&]() -> absl::Status {
    RETURN_IF_ERROR(red->BeginBackward(sched::SyncMode::kSync));
    for (size_t p = 0; p < n; ++p) {
      RETURN_IF_ERROR(red->MarkReady(params[p].id, DeviceEvent{events[p].get()}));
    }
    return red->FinishBackward();
  };
  RETURN_IF_ERROR(write(g1));
  RETURN_IF_ERROR(backward());  // the buckets now hold g1

  if (how == Zeroing::kHostWait)
    RETURN_IF_ERROR(red->ZeroGrads());  // returns after the memsets ran
  gpu.cuda->StallEvents(true);          // from here the comm stream only runs when let go
  if (how != Zeroing::kHostWait) {
    ASSIGN_OR_RETURN(WorkPtr zeroed, red->ZeroGradsAsync());
    if (!zeroed->device_event()) return absl::InternalError("ZeroGradsAsync gave no event");
    if (how == Zeroing::kAsyncAndWait) {
      RETURN_IF_ERROR(
          CudaStatus(*cuda,
                     cuda->StreamWaitEvent(compute.get(),
                                           static_cast<cudaEvent_t>(zeroed->device_event().handle)),
                     "cudaStreamWaitEvent"));
    }
    zero_works.push_back(std::move(zeroed));
  }
  RETURN_IF_ERROR(write(g2));
  {
    // Let go and, before anything else can move the comm stream (the poller needs the lock),
    // run the compute stream as far as it may: its wait on the zeroing event runs the comm
    // stream up to that event (the memsets, if the event comes after them), then its copies.
    std::lock_guard<std::mutex> lock(gpu.cuda->mu());
    gpu.cuda->StallEventsLocked(false);
    gpu.cuda->PumpLocked(compute.get());
  }
  RETURN_IF_ERROR(backward());
  size_t wrong = 0;
  for (size_t p = 0; p < n; ++p) {
    ASSIGN_OR_RETURN(TensorView v, red->GradView(params[p].id));
    // Fake device memory is host memory; FinishBackward saw every bucket's operations run.
    if (std::memcmp(v.data, g2[p].data(), g2[p].size() * 4) != 0) ++wrong;
  }
  RETURN_IF_ERROR(WaitForStream(cuda, compute.get(), absl::Now() + absl::Seconds(60)));
  return wrong;
}

size_t ZeroAndReduce(Zeroing how) {
  FakeGpu gpu;
  size_t wrong = 0;
  RunFakeRanks(gpu, 1, FakeConfig(), [&](NcclGroup& world) {
    absl::StatusOr<size_t> w = RunZeroing(world, gpu, how);
    ASSERT_TRUE(w.ok()) << w.status();
    wrong = *w;
  });
  ExpectClean(gpu);
  return wrong;
}

TEST(NcclReducerZeroTest, AsyncZeroingIsOrderedByItsEvent) {
  EXPECT_EQ(ZeroAndReduce(Zeroing::kAsyncAndWait), 0u);
}

TEST(NcclReducerZeroTest, HostWaitingZeroGradsIsOrderedWithoutAnEvent) {
  EXPECT_EQ(ZeroAndReduce(Zeroing::kHostWait), 0u);
}

// Negative control: without the wait on ZeroGradsAsync's event the memset lands after the
// framework's writes and zeroes them (so the tests above would see a misordered memset).
TEST(NcclReducerZeroTest, ControlWithoutTheEventWaitLosesTheGradients) {
  EXPECT_EQ(ZeroAndReduce(Zeroing::kAsyncNoWait), sched::reference::MakeParams(0).size());
}

// A memset that fails is returned by ZeroGrads / ZeroGradsAsync, naming the bucket (a window
// that silently started from stale gradients would be lost accumulation).
class FailingMemsetCuda final : public ForwardingCudaApi {
 public:
  using ForwardingCudaApi::ForwardingCudaApi;
  cudaError_t MemsetAsync(void* d, int v, size_t n, cudaStream_t st) override {
    if (fail.load()) return cudaErrorInvalidValue;
    return ForwardingCudaApi::MemsetAsync(d, v, n, st);
  }
  std::atomic<bool> fail{false};
};

TEST(NcclReducerZeroTest, FailedMemsetIsReturnedNamingTheBucket) {
  FakeGpu gpu;
  auto cuda = std::make_shared<FailingMemsetCuda>(gpu.cuda);
  absl::StatusOr<std::string> id = NewUniqueIdBytes(*gpu.nccl);
  ASSERT_TRUE(id.ok()) << id.status();
  auto backend = NcclBackend::CreateFromUniqueId(NcclApis{cuda, gpu.nccl, gpu.kernels}, *id, 1, 0,
                                                 FakeConfig());
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto world = (*backend)->WorldGroup(0);
  ASSERT_TRUE(world.ok()) << world.status();
  std::vector<sched::ParamSpec> params = sched::reference::MakeParams(0);
  for (auto& p : params) p.device = Device{DeviceType::kCuda, 0};
  auto red =
      sched::GradientReducer::Create(params, {world->get(), nullptr}, sched::ReducerConfig{});
  ASSERT_TRUE(red.ok()) << red.status();
  cuda->fail = true;
  const absl::Status sync = (*red)->ZeroGrads();
  EXPECT_FALSE(sync.ok());
  EXPECT_NE(sync.message().find("zeroing bucket"), absl::string_view::npos) << sync;
  const absl::StatusOr<WorkPtr> async = (*red)->ZeroGradsAsync();
  EXPECT_FALSE(async.ok());
  EXPECT_NE(async.status().message().find("zeroing bucket"), absl::string_view::npos)
      << async.status();
  cuda->fail = false;
  EXPECT_TRUE((*red)->ZeroGrads().ok());
  red->reset();
  world->reset();
  backend->reset();
  ExpectClean(gpu);
}

// f64 device buckets: reduce_scatter_only is refused at BeginBackward, naming the bucket (the
// device adds f32/bf16/f16 only), not in the middle of the window.
TEST(NcclReducerRsOnlyTest, F64BucketsAreRefusedUpFront) {
  FakeGpu gpu;
  RunFakeRanks(gpu, 2, FakeConfig(), [&](NcclGroup& world) {
    auto mesh = MakeMesh(world, 2, 1);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    sched::ParamSpec p;
    p.id = 7;
    p.count = 100;
    p.dtype = DType::kF64;
    p.name = "w64";
    p.device = Device{DeviceType::kCuda, 0};
    sched::ReducerConfig cfg;
    cfg.mode = sched::ReduceMode::kHybrid;
    auto red = sched::GradientReducer::Create({p}, {mesh->shard.get(), mesh->replica.get()}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    const absl::Status s = (*red)->BeginBackward(sched::SyncMode::kReduceScatterOnly);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(s.message().find("bucket 0 holds f64"), absl::string_view::npos) << s;
    EXPECT_NE(s.message().find("w64"), absl::string_view::npos) << s;
    EXPECT_TRUE((*red)->BeginBackward(sched::SyncMode::kSync).ok());  // the synced mode works
    (*red)->MarkReady(7).IgnoreError();
    EXPECT_TRUE((*red)->FinishBackward().ok());
  });
  ExpectClean(gpu);
}

}  // namespace
}  // namespace braid::nccl::testing
