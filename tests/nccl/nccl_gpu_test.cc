// The nccl backend on a real GPU with the real CUDA runtime and NCCL 2.28.9: single-rank
// worlds (NCCL rejects two ranks on one device), so these check the API plumbing, not
// multi-rank arithmetic: every collective and reduce op, avg and pre-mul-sum, in-place forms,
// readiness events from a compute stream, the completion event, coalescing, split, the
// nonblocking path, finalize and abort. Without a GPU (CUDA error 35 or 100) every test skips.
//
//   tools/bazelw test //tests/nccl:nccl_gpu_test --test_output=all
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backends/nccl/errors.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/nccl/unique_id.h"
#include "comm/half.h"
#include "gtest/gtest.h"
#include "optim/cuda_owners.h"
#include "tests/multirank.h"
#include "tests/nccl/real_gpu_world.h"

namespace braid::nccl {
namespace {

constexpr absl::Duration kWait = absl::Seconds(60);

class NcclGpu : public ::testing::TestWithParam<bool /*blocking*/> {
 protected:
  void SetUp() override {
    BRAID_SKIP_WITHOUT_GPU();
    auto w = testing::MakeRealSingleRankWorld(GetParam());
    ASSERT_TRUE(w.ok()) << w.status();
    backend_ = std::move(w->backend);
    world_.reset(static_cast<NcclGroup*>(w->world.release()));
  }

  // Device copy of `host`, freed by the test's owner vector.
  void* ToDevice(const void* host, size_t bytes) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, bytes == 0 ? 1 : bytes), cudaSuccess);
    buffers_.emplace_back(d);
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    }
    return d;
  }
  template <typename T>
  std::vector<T> ToHost(const void* d, size_t n) {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }

  struct CudaFree {
    void operator()(void* p) const { cudaFree(p); }
  };
  std::unique_ptr<NcclBackend> backend_;
  std::unique_ptr<NcclGroup> world_;
  std::vector<std::unique_ptr<void, CudaFree>> buffers_;
};

TEST_P(NcclGpu, EveryCollectiveAndOpOnOneRank) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.5f;
  const size_t bytes = x.size() * sizeof(float);
  for (const ReduceOp& op : {ReduceOp::Sum(), ReduceOp::Avg(), ReduceOp::Max(), ReduceOp::Min(),
                             ReduceOp::PreMulSum(0.25)}) {
    SCOPED_TRACE(ReduceOpName(op));
    void* d = ToDevice(x.data(), bytes);
    void* out = ToDevice(x.data(), bytes);
    auto w = world_->AllReduce(d, d, x.size(), DType::kF32, op);  // in place
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(kWait));
    auto w2 = world_->ReduceScatter(d, out, x.size(), DType::kF32, op);  // out of place
    ASSERT_TRUE(w2.ok()) << w2.status();
    ASSERT_OK((*w2)->Wait(kWait));
    const float s = op.kind == ReduceKind::kPreMulSum ? 0.25f * 0.25f : 1.0f;
    const std::vector<float> got = ToHost<float>(out, x.size());
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], x[i] * s) << i;
  }
  void* d = ToDevice(x.data(), bytes);
  auto ag = world_->AllGather(d, d, x.size(), DType::kF32);  // in place at rank 0
  ASSERT_TRUE(ag.ok()) << ag.status();
  ASSERT_OK((*ag)->Wait(kWait));
  auto bc = world_->Broadcast(d, x.size(), DType::kF32, 0);
  ASSERT_TRUE(bc.ok()) << bc.status();
  ASSERT_OK((*bc)->Wait(kWait));
  auto bar = world_->Barrier();
  ASSERT_TRUE(bar.ok()) << bar.status();
  ASSERT_OK((*bar)->Wait(kWait));
  EXPECT_EQ(ToHost<float>(d, x.size()), x);
}

TEST_P(NcclGpu, Bf16PreMulSumUsesTheBf16Scalar) {
  std::vector<uint16_t> x(64, ToBF16(3.0f).bits);
  void* d = ToDevice(x.data(), x.size() * 2);
  auto w = world_->AllReduce(d, d, x.size(), DType::kBF16, ReduceOp::PreMulSum(0.1));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_OK((*w)->Wait(kWait));
  const uint16_t want = ToBF16(3.0f * ToFloat(ToBF16(0.1f))).bits;
  for (uint16_t v : ToHost<uint16_t>(d, x.size())) EXPECT_EQ(v, want);
}

// Readiness from a compute stream: the comm stream waits on the producer's event.
TEST_P(NcclGpu, ReadyEventFromComputeStreamAndCompletionEvent) {
  std::vector<float> zeros(1 << 20, 0.0f), ones(1 << 20, 1.0f);
  void* src = ToDevice(ones.data(), ones.size() * 4);
  void* d = ToDevice(zeros.data(), zeros.size() * 4);
  cudaStream_t compute, consumer;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t ready;
  ASSERT_EQ(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d, src, ones.size() * 4, cudaMemcpyDeviceToDevice, compute),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(ready, compute), cudaSuccess);
  CollectiveOptions o;
  o.ready_event = DeviceEvent{ready};
  o.label = "bucket 0";
  auto w = world_->AllReduce(d, d, ones.size(), DType::kF32, ReduceOp::Sum(), o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(cudaStreamWaitEvent(consumer, static_cast<cudaEvent_t>((*w)->device_event().handle), 0),
            cudaSuccess);
  std::vector<float> back(ones.size());
  ASSERT_EQ(cudaMemcpyAsync(back.data(), d, back.size() * 4, cudaMemcpyDeviceToHost, consumer),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(consumer), cudaSuccess);
  ASSERT_OK((*w)->Wait(kWait));
  EXPECT_EQ(back, ones);
  cudaEventDestroy(ready);
  cudaStreamDestroy(compute);
  cudaStreamDestroy(consumer);
}

TEST_P(NcclGpu, CoalescedBucketAndSplit) {
  std::vector<float> x(256, 2.0f);
  void* a = ToDevice(x.data(), 1024);
  void* b = ToDevice(x.data(), 1024);
  ASSERT_OK(world_->StartCoalescing());
  ASSERT_TRUE(world_->AllReduce(a, a, 256, DType::kF32, ReduceOp::Avg()).ok());
  ASSERT_TRUE(world_->ReduceScatter(b, b, 256, DType::kF32, ReduceOp::PreMulSum(0.5)).ok());
  auto bucket = world_->EndCoalescing("bucket 1");
  ASSERT_TRUE(bucket.ok()) << bucket.status();
  ASSERT_OK((*bucket)->Wait(kWait));
  EXPECT_EQ(ToHost<float>(a, 256), x);
  EXPECT_EQ(ToHost<float>(b, 256), std::vector<float>(256, 1.0f));
  auto child = world_->Split(0, 0, "shard");
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_NE(*child, nullptr);
  auto w = (*child)->AllReduce(a, a, 256, DType::kF32, ReduceOp::Sum());
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_OK((*w)->Wait(kWait));
  auto none = world_->Split(kNoColor, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
}

TEST_P(NcclGpu, FinalizeAndAbort) {
  auto id = NewUniqueIdBytes(*RealNcclApi());
  ASSERT_TRUE(id.ok());
  ncclUniqueId uid = *UniqueIdFromBytes(*id);
  NcclComm::Config cfg{"extra", GetParam(), 0, absl::Seconds(60)};
  auto a = NcclComm::Init(RealApis(), uid, 1, 0, cfg, absl::Now() + kWait);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_OK((*a)->Finalize(absl::Now() + kWait));
  auto id2 = NewUniqueIdBytes(*RealNcclApi());
  auto b = NcclComm::Init(RealApis(), *UniqueIdFromBytes(*id2), 1, 0, cfg, absl::Now() + kWait);
  ASSERT_TRUE(b.ok()) << b.status();
  (*b)->Abort(absl::AbortedError("test abort"));
  EXPECT_TRUE((*b)->failed());
  std::unique_lock<std::mutex> lock = (*b)->Lock();
  EXPECT_EQ((*b)->ReadyLocked(absl::Now()).message(), "test abort");
}

// cudaEventQuery's "not ready" is kept as the thread's last error by the runtime; RealCudaApi
// clears it, or the next kernel launcher's cudaGetLastError() on that thread (the completion
// poller casts, the stepper launches AdamW) would report a failure that is none.
TEST(NcclGpuRuntime, NotReadyQueryLeavesNoLastError) {
  BRAID_SKIP_WITHOUT_GPU();
  optim::Stream stream;
  optim::Event event;
  optim::DeviceBuffer buf;
  constexpr size_t kBytes = size_t{256} << 20;
  ASSERT_EQ(stream.Create(), cudaSuccess);
  ASSERT_EQ(event.Create(), cudaSuccess);
  ASSERT_EQ(buf.Allocate(kBytes), cudaSuccess);
  const auto busy_then_record = [&] {
    for (int i = 0; i < 40; ++i)
      ASSERT_EQ(cudaMemsetAsync(buf.get(), i, kBytes, stream.get()), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(event.get(), stream.get()), cudaSuccess);
  };
  busy_then_record();
  const cudaError_t q = RealCudaApi()->EventQuery(event.get());
  if (q == cudaSuccess) GTEST_SKIP() << "10 GB of memsets finished before the query";
  ASSERT_EQ(q, cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
  // What the raw runtime does (recorded in the log for docs/gpu-results.md, not asserted).
  busy_then_record();
  const cudaError_t raw = cudaEventQuery(event.get());
  const cudaError_t left = cudaGetLastError();
  std::printf("raw cudaEventQuery: %d, cudaGetLastError after it: %d (%s)\n", static_cast<int>(raw),
              static_cast<int>(left), cudaGetErrorName(left));
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Modes, NcclGpu, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "blocking" : "nonblocking");
                         });

}  // namespace
}  // namespace braid::nccl
