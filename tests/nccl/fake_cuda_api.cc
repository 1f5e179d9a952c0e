#include "tests/nccl/fake_cuda_api.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace braid::nccl::testing {

FakeCudaApi::~FakeCudaApi() = default;

void FakeCudaApi::ErrorLocked(std::string what) { errors_.push_back(std::move(what)); }
void FakeCudaApi::LogLocked(std::string what) {
  if (log_.size() < 100000) log_.push_back(std::move(what));
}

cudaError_t FakeCudaApi::GetDeviceCount(int* count) {
  std::lock_guard<std::mutex> lock(mu_);
  *count = count_rc_ == cudaSuccess ? count_ : 0;
  return count_rc_;
}

cudaError_t FakeCudaApi::SetDevice(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  return device >= 0 && device < count_ ? cudaSuccess : cudaErrorInvalidDevice;
}

cudaError_t FakeCudaApi::StreamCreate(cudaStream_t* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = std::make_unique<Stream>();
  s->id = next_id_++;
  *stream = reinterpret_cast<cudaStream_t>(s.get());
  streams_.emplace(s.get(), std::move(s));
  return cudaSuccess;
}

cudaError_t FakeCudaApi::StreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(reinterpret_cast<Stream*>(stream));
  if (it == streams_.end()) {
    ErrorLocked("StreamDestroy of an unknown stream");
    return cudaErrorInvalidResourceHandle;
  }
  // As CUDA: queued work still runs. The fake runs what can run now and drops the rest
  // (events recorded on it then count as complete).
  PumpLocked(stream);
  for (auto& [p, e] : events_) {
    if (e->stream == it->second.get()) e->stream = nullptr;
  }
  streams_.erase(it);
  return cudaSuccess;
}

cudaError_t FakeCudaApi::EventCreate(cudaEvent_t* event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto e = std::make_unique<Event>();
  e->id = next_id_++;
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  events_.emplace(e.get(), std::move(e));
  return cudaSuccess;
}

cudaError_t FakeCudaApi::EventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (events_.erase(reinterpret_cast<Event*>(event)) == 0) {
    ErrorLocked("EventDestroy of an unknown event");
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}

FakeCudaApi::Stream* FakeCudaApi::StreamLocked(cudaStream_t s) {
  if (s == nullptr) return &legacy_;
  auto it = streams_.find(reinterpret_cast<Stream*>(s));
  return it == streams_.end() ? nullptr : it->second.get();
}

std::string FakeCudaApi::Name(cudaStream_t s) const {
  if (s == nullptr) return "s0";
  auto it = streams_.find(reinterpret_cast<Stream*>(s));
  return it == streams_.end() ? "s?" : absl::StrCat("s", it->second->id);
}

std::string FakeCudaApi::Name(cudaEvent_t e) const {
  auto it = events_.find(reinterpret_cast<Event*>(e));
  return it == events_.end() ? "e?" : absl::StrCat("e", it->second->id);
}

cudaError_t FakeCudaApi::EventRecord(cudaEvent_t event, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(reinterpret_cast<Event*>(event));
  Stream* s = StreamLocked(stream);
  if (it == events_.end() || s == nullptr) {
    ErrorLocked("EventRecord with an unknown event or stream");
    return cudaErrorInvalidResourceHandle;
  }
  it->second->stream = s;
  it->second->ticket = s->pushed;
  LogLocked(absl::StrCat("EventRecord(", Name(event), ",", Name(stream), ")"));
  return cudaSuccess;
}

void FakeCudaApi::PumpLocked(cudaStream_t stream) {
  Stream* s = StreamLocked(stream);
  if (s == nullptr) return;
  while (!s->items.empty() && s->items.front()()) {
    s->items.pop_front();
    ++s->completed;
  }
}

bool FakeCudaApi::EventDoneLocked(Event* e) {
  if (e->stream == nullptr) return true;
  Stream* s = e->stream;
  if (s->completed < e->ticket) {
    PumpLocked(s == &legacy_ ? nullptr : reinterpret_cast<cudaStream_t>(s));
  }
  return s->completed >= e->ticket;
}

cudaError_t FakeCudaApi::EventQuery(cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(reinterpret_cast<Event*>(event));
  if (it == events_.end()) {
    ErrorLocked("EventQuery of an unknown event");
    return cudaErrorInvalidResourceHandle;
  }
  if (query_rc_ != cudaSuccess) return query_rc_;
  if (stall_) return cudaErrorNotReady;
  return EventDoneLocked(it->second.get()) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t FakeCudaApi::StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(reinterpret_cast<Event*>(event));
  Stream* s = StreamLocked(stream);
  if (it == events_.end() || s == nullptr) {
    ErrorLocked("StreamWaitEvent with an unknown event or stream");
    return cudaErrorInvalidResourceHandle;
  }
  ++stream_waits_;
  LogLocked(absl::StrCat("StreamWaitEvent(", Name(stream), ",", Name(event), ")"));
  // As CUDA: waits for the event's most recent record at the time of this call.
  Event snapshot = *it->second;
  EnqueueLocked(stream, [this, snapshot]() mutable {
    if (stall_) return false;
    return EventDoneLocked(&snapshot);
  });
  return cudaSuccess;
}

void FakeCudaApi::EnqueueLocked(cudaStream_t stream, Item item) {
  Stream* s = StreamLocked(stream);
  if (s == nullptr) {
    ErrorLocked("work enqueued on an unknown stream");
    return;
  }
  s->items.push_back(std::move(item));
  ++s->pushed;
}

cudaError_t FakeCudaApi::Malloc(void** ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto b = std::make_unique<char[]>(bytes);
  *ptr = b.get();
  buffers_.emplace(b.get(), std::move(b));
  return cudaSuccess;
}

cudaError_t FakeCudaApi::Free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pinned_.count(ptr) != 0) {
    ErrorLocked("Free of pinned host memory (cudaFreeHost frees it)");
    return cudaErrorInvalidValue;
  }
  if (buffers_.erase(ptr) == 0) {
    ErrorLocked("Free of an unknown pointer");
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

// Pinned host memory: one of the buffers (live_buffers counts it), freed by FreeHost only.
cudaError_t FakeCudaApi::MallocHost(void** ptr, size_t bytes) {
  const cudaError_t rc = Malloc(ptr, bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (rc == cudaSuccess) pinned_.insert(*ptr);
  return rc;
}

cudaError_t FakeCudaApi::FreeHost(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pinned_.erase(ptr) == 0) {
      ErrorLocked("FreeHost of a pointer MallocHost did not return");
      return cudaErrorInvalidValue;
    }
  }
  return Free(ptr);
}

int FakeCudaApi::live_pinned_host() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(pinned_.size());
}

cudaError_t FakeCudaApi::MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                     cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (StreamLocked(stream) == nullptr) return cudaErrorInvalidResourceHandle;
  LogLocked(absl::StrCat("MemcpyAsync(", bytes, ",", Name(stream), ")"));
  EnqueueLocked(stream, [dst, src, bytes] {
    if (bytes > 0) std::memmove(dst, src, bytes);  // a 0-byte copy may name a null buffer
    return true;
  });
  return cudaSuccess;
}

cudaError_t FakeCudaApi::MemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (StreamLocked(stream) == nullptr) return cudaErrorInvalidResourceHandle;
  LogLocked(absl::StrCat("MemsetAsync(", bytes, ",", Name(stream), ")"));
  EnqueueLocked(stream, [dst, value, bytes] {
    if (bytes > 0) std::memset(dst, value, bytes);
    return true;
  });
  return cudaSuccess;
}

const char* FakeCudaApi::ErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    default:
      return "fake CUDA error";
  }
}

void FakeCudaApi::SetDeviceCountResult(cudaError_t rc, int count) {
  std::lock_guard<std::mutex> lock(mu_);
  count_rc_ = rc;
  count_ = count;
}

void FakeCudaApi::StallEvents(bool stall) {
  std::lock_guard<std::mutex> lock(mu_);
  stall_ = stall;
}

void FakeCudaApi::FailEventQueries(cudaError_t rc) {
  std::lock_guard<std::mutex> lock(mu_);
  query_rc_ = rc;
}

int FakeCudaApi::live_streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(streams_.size());
}
int FakeCudaApi::live_events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(events_.size());
}
int FakeCudaApi::live_buffers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(buffers_.size());
}
int FakeCudaApi::stream_wait_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stream_waits_;
}
std::vector<std::string> FakeCudaApi::errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}
std::vector<std::string> FakeCudaApi::log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

}  // namespace braid::nccl::testing
