// RAII owners of the CUDA objects the backend creates through a CudaApi: a stream, an event,
// a device allocation. Each is created by a factory that returns a status naming what failed,
// and freed exactly once by its destructor (errors there are logged: nothing to return to).
//
//   ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(apis.cuda, "group 'world'"));
//   ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::Create(apis.cuda));
//   RETURN_IF_ERROR(CudaStatus(*apis.cuda, apis.cuda->EventRecord(done.get(), stream.get()),
//                              "cudaEventRecord"));
#ifndef BRAID_BACKENDS_NCCL_CUDA_HANDLES_H_
#define BRAID_BACKENDS_NCCL_CUDA_HANDLES_H_

#include <cstddef>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "backends/nccl/cuda_api.h"

namespace braid::nccl {

class CudaStream {
 public:
  CudaStream() = default;
  // cudaStreamNonBlocking; `owner` names what the stream is for in the error.
  static absl::StatusOr<CudaStream> Create(std::shared_ptr<CudaApi> cuda, absl::string_view owner);
  CudaStream(CudaStream&& o) noexcept { *this = std::move(o); }
  CudaStream& operator=(CudaStream&& o) noexcept;
  ~CudaStream() { Reset(); }
  cudaStream_t get() const { return stream_; }

 private:
  void Reset();
  std::shared_ptr<CudaApi> cuda_;
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  // cudaEventDisableTiming.
  static absl::StatusOr<CudaEvent> Create(std::shared_ptr<CudaApi> cuda);
  CudaEvent(CudaEvent&& o) noexcept { *this = std::move(o); }
  CudaEvent& operator=(CudaEvent&& o) noexcept;
  ~CudaEvent() { Reset(); }
  cudaEvent_t get() const { return event_; }
  explicit operator bool() const { return event_ != nullptr; }

 private:
  void Reset();
  std::shared_ptr<CudaApi> cuda_;
  cudaEvent_t event_ = nullptr;
};

// Device memory (cudaMalloc), or pinned host memory (cudaMallocHost) with `pinned_host`.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(std::shared_ptr<CudaApi> cuda, size_t bytes,
                                               absl::string_view what, bool pinned_host = false);
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  ~DeviceBuffer() { Reset(); }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void Reset();
  std::shared_ptr<CudaApi> cuda_;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool pinned_host_ = false;
};

// Returns once everything queued on `stream` so far has run: records an event there and polls
// it until `deadline`. CUDA errors name "cudaEventRecord<where>" / "cudaEventQuery<where>"; a
// missed deadline is DeadlineExceeded (the caller says what was late).
absl::Status WaitForStream(const std::shared_ptr<CudaApi>& cuda, cudaStream_t stream,
                           absl::Time deadline, absl::string_view where = "");

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_CUDA_HANDLES_H_
