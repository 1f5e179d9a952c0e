// The CUDA runtime keeps a current device per host thread (0 on a new thread), and a call made
// with another device current goes to that device (a stray context, or an invalid handle). This
// test gives each fake rank its own device and a CudaApi that tracks every thread's current
// device, then checks that every call the backend makes on that rank's streams, events and
// memory (from the rank's thread and from the backend's completion poller thread) has the
// rank's device current. Rank 1 sits on device 1, so a thread that never set its device shows.
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "backends/nccl/unique_id.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "tests/collective_check.h"
#include "tests/multirank.h"
#include "tests/nccl/fake_gpu.h"
#include "tests/nccl/forwarding_cuda_api.h"

namespace braid::nccl::testing {
namespace {

// Forwards to the fake, recording each call made while the calling thread's current device
// (as CUDA would track it) is not `expected`.
class DeviceTrackingCuda final : public ForwardingCudaApi {
 public:
  DeviceTrackingCuda(std::shared_ptr<FakeCudaApi> fake, int expected)
      : ForwardingCudaApi(std::move(fake)), expected_(expected) {}

  std::vector<std::string> wrong_device_calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return wrong_;
  }

  cudaError_t SetDevice(int device) override {
    const cudaError_t rc = ForwardingCudaApi::SetDevice(device);
    if (rc == cudaSuccess) {
      std::lock_guard<std::mutex> lock(mu_);
      current_[std::this_thread::get_id()] = device;
    }
    return rc;
  }
  cudaError_t StreamCreate(cudaStream_t* s) override {
    return Check("StreamCreate"), ForwardingCudaApi::StreamCreate(s);
  }
  cudaError_t StreamDestroy(cudaStream_t s) override {
    return Check("StreamDestroy"), ForwardingCudaApi::StreamDestroy(s);
  }
  cudaError_t EventCreate(cudaEvent_t* e) override {
    return Check("EventCreate"), ForwardingCudaApi::EventCreate(e);
  }
  cudaError_t EventDestroy(cudaEvent_t e) override {
    return Check("EventDestroy"), ForwardingCudaApi::EventDestroy(e);
  }
  cudaError_t EventRecord(cudaEvent_t e, cudaStream_t s) override {
    return Check("EventRecord"), ForwardingCudaApi::EventRecord(e, s);
  }
  cudaError_t EventQuery(cudaEvent_t e) override {
    return Check("EventQuery"), ForwardingCudaApi::EventQuery(e);
  }
  cudaError_t StreamWaitEvent(cudaStream_t s, cudaEvent_t e) override {
    return Check("StreamWaitEvent"), ForwardingCudaApi::StreamWaitEvent(s, e);
  }
  cudaError_t Malloc(void** p, size_t n) override {
    return Check("Malloc"), ForwardingCudaApi::Malloc(p, n);
  }
  cudaError_t Free(void* p) override { return Check("Free"), ForwardingCudaApi::Free(p); }
  cudaError_t MallocHost(void** p, size_t n) override {
    return Check("MallocHost"), ForwardingCudaApi::MallocHost(p, n);
  }
  cudaError_t FreeHost(void* p) override {
    return Check("FreeHost"), ForwardingCudaApi::FreeHost(p);
  }
  cudaError_t MemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k,
                          cudaStream_t st) override {
    return Check("MemcpyAsync"), ForwardingCudaApi::MemcpyAsync(d, s, n, k, st);
  }
  cudaError_t MemsetAsync(void* d, int v, size_t n, cudaStream_t st) override {
    return Check("MemsetAsync"), ForwardingCudaApi::MemsetAsync(d, v, n, st);
  }

 private:
  void Check(const char* call) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = current_.find(std::this_thread::get_id());
    const int current = it == current_.end() ? 0 : it->second;  // CUDA: a new thread is on 0
    if (current != expected_) {
      wrong_.push_back(
          absl::StrCat(call, " with device ", current, " current (expected ", expected_, ")"));
    }
  }

  const int expected_;
  mutable std::mutex mu_;
  std::map<std::thread::id, int> current_;  // guarded by mu_
  std::vector<std::string> wrong_;          // guarded by mu_
};

absl::Status Exercise(Group& world) {
  using braid::testing::CollectiveCase;
  for (CollectiveKind k : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                           CollectiveKind::kAllGather, CollectiveKind::kBroadcast}) {
    RETURN_IF_ERROR(
        braid::testing::RunAndCheck(world, CollectiveCase{k, ReduceKind::kSum, DType::kF32, 100}));
  }
  RETURN_IF_ERROR(braid::testing::RunAndCheck(
      world, CollectiveCase{CollectiveKind::kAllReduce, ReduceKind::kPreMulSum, DType::kF32, 33}));
  ASSIGN_OR_RETURN(std::unique_ptr<Group> half, world.Split(0, world.rank(), "all"));
  RETURN_IF_ERROR(braid::testing::RunAndCheck(
      *half, CollectiveCase{CollectiveKind::kAllReduce, ReduceKind::kAvg, DType::kF32, 64}));
  BufferOps& ops = half->buffer_ops();
  ASSIGN_OR_RETURN(OwnedBuffer buf, ops.Allocate(256, "scratch"));
  RETURN_IF_ERROR(ops.Zero(buf.get(), 256));
  return ops.Synchronize(absl::Now() + absl::Seconds(30));
}

TEST(NcclDeviceContext, EveryCallRunsOnTheRanksDevice) {
  constexpr int kRanks = 2;
  FakeGpu gpu;
  gpu.cuda->SetDeviceCountResult(cudaSuccess, kRanks);
  absl::StatusOr<std::string> id = NewUniqueIdBytes(*gpu.nccl);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<std::shared_ptr<DeviceTrackingCuda>> tracking;
  for (int r = 0; r < kRanks; ++r)
    tracking.push_back(std::make_shared<DeviceTrackingCuda>(gpu.cuda, r));
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      NcclBackendConfig config = FakeConfig();
      config.device = r;
      auto backend = NcclBackend::CreateFromUniqueId(NcclApis{tracking[r], gpu.nccl, gpu.kernels},
                                                     *id, kRanks, r, config);
      ASSERT_TRUE(backend.ok()) << backend.status();
      auto world = (*backend)->WorldGroup(r);
      ASSERT_TRUE(world.ok()) << world.status();
      EXPECT_OK(Exercise(**world));
    });
  }
  for (auto& t : threads) t.join();
  ExpectClean(gpu);
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<std::string> wrong = tracking[r]->wrong_device_calls();
    EXPECT_TRUE(wrong.empty()) << "rank " << r << ": " << wrong.size()
                               << " calls on the wrong device, e.g.\n"
                               << absl::StrJoin(wrong.begin(),
                                                wrong.begin() + std::min<size_t>(wrong.size(), 8),
                                                "\n");
  }
}

}  // namespace
}  // namespace braid::nccl::testing
