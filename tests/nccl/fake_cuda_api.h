// FakeCudaApi: a CPU stand-in for the CUDA runtime, so the nccl backend's stream/event logic
// runs in unit tests without a GPU.
//
// "Device" memory is host memory. A stream is a FIFO of items; an item is a function that
// returns true once it has done its work (a memcpy at once; a fake NCCL collective once every
// rank has posted it; a cross-stream wait once its event has completed). Streams advance only
// when someone looks: EventQuery (and any wait on the stream) runs the items at the head of
// the event's stream until one is not done yet. So ordering is real (an event recorded before
// the collective completes before it, as on a GPU), and nothing runs on a thread of its own.
//
//   auto cuda = std::make_shared<FakeCudaApi>();
//   auto nccl = std::make_shared<FakeNcclApi>(cuda);    // shares the fake device's lock
//   cuda->StallEvents(true);        // every EventQuery says cudaErrorNotReady from now on
//   EXPECT_EQ(cuda->live_events(), 0);                   // leak checks after teardown
//
// Everything is guarded by one mutex (mu()), which FakeNcclApi shares.
#ifndef BRAID_TESTS_NCCL_FAKE_CUDA_API_H_
#define BRAID_TESTS_NCCL_FAKE_CUDA_API_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "backends/nccl/cuda_api.h"

namespace braid::nccl::testing {

class FakeCudaApi : public CudaApi {
 public:
  using Item = std::function<bool()>;  // runs under mu(); true once done

  FakeCudaApi() = default;
  ~FakeCudaApi() override;

  cudaError_t GetDeviceCount(int* count) override;
  cudaError_t SetDevice(int device) override;
  cudaError_t StreamCreate(cudaStream_t* stream) override;
  cudaError_t StreamDestroy(cudaStream_t stream) override;
  cudaError_t EventCreate(cudaEvent_t* event) override;
  cudaError_t EventDestroy(cudaEvent_t event) override;
  cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) override;
  cudaError_t EventQuery(cudaEvent_t event) override;
  cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) override;
  cudaError_t Malloc(void** ptr, size_t bytes) override;
  cudaError_t Free(void* ptr) override;
  cudaError_t MallocHost(void** ptr, size_t bytes) override;
  cudaError_t FreeHost(void* ptr) override;
  cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                          cudaStream_t stream) override;
  cudaError_t MemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) override;
  const char* ErrorString(cudaError_t error) override;

  // --- For the fake NCCL and tests --------------------------------------------------------
  std::mutex& mu() { return mu_; }
  // Under mu(): appends an item to `stream` (null: the legacy stream, which always exists).
  void EnqueueLocked(cudaStream_t stream, Item item);
  // Under mu(): runs `stream`'s head items while they finish.
  void PumpLocked(cudaStream_t stream);
  // Under mu(): appends to log() / errors().
  void LogLocked(std::string what);
  void ErrorLocked(std::string what);
  // Under mu(): "s3", "e7" (as in log()).
  std::string Name(cudaStream_t s) const;
  std::string Name(cudaEvent_t e) const;

  // Knobs.
  void SetDeviceCountResult(cudaError_t rc, int count);   // default: cudaSuccess, 1 device
  void StallEvents(bool stall);                           // EventQuery -> cudaErrorNotReady
  void StallEventsLocked(bool stall) { stall_ = stall; }  // the same, under mu()
  void FailEventQueries(cudaError_t rc);                  // EventQuery -> rc (cudaSuccess: off)

  // Observations.
  int live_streams() const;
  int live_events() const;
  int live_buffers() const;
  int live_pinned_host() const;  // MallocHost'd, not yet FreeHost'd (also in live_buffers)
  int stream_wait_calls() const;
  std::vector<std::string> errors() const;  // misuse seen (unknown handles, double frees)
  // Every call, in order: "StreamWaitEvent(s1,e3)", "EventRecord(e4,s1)", ...
  std::vector<std::string> log() const;

 private:
  struct Stream {
    int id = 0;
    std::deque<Item> items;
    uint64_t pushed = 0;
    uint64_t completed = 0;
  };
  struct Event {
    int id = 0;
    Stream* stream = nullptr;  // null: never recorded (complete, as in CUDA)
    uint64_t ticket = 0;
  };

  Stream* StreamLocked(cudaStream_t s);
  bool EventDoneLocked(Event* e);

  mutable std::mutex mu_;
  std::map<Stream*, std::unique_ptr<Stream>> streams_;
  std::map<Event*, std::unique_ptr<Event>> events_;
  Stream legacy_;
  std::map<void*, std::unique_ptr<char[]>> buffers_;
  std::set<void*> pinned_;  // the MallocHost'd among buffers_
  int next_id_ = 1;
  cudaError_t count_rc_ = cudaSuccess;
  int count_ = 1;
  bool stall_ = false;
  cudaError_t query_rc_ = cudaSuccess;
  int stream_waits_ = 0;
  std::vector<std::string> errors_;
  std::vector<std::string> log_;
};

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_FAKE_CUDA_API_H_
