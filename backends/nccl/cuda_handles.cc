#include "backends/nccl/cuda_handles.h"

#include "absl/strings/str_cat.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/poll.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::nccl {
namespace {

void LogIfError(CudaApi& cuda, cudaError_t rc, absl::string_view call) {
  const absl::Status s = CudaStatus(cuda, rc, call);
  if (!s.ok()) Log().error("nccl backend: {}", s.ToString());
}

}  // namespace

absl::StatusOr<CudaStream> CudaStream::Create(std::shared_ptr<CudaApi> cuda,
                                              absl::string_view owner) {
  CudaStream s;
  RETURN_IF_ERROR(CudaStatus(*cuda, cuda->StreamCreate(&s.stream_),
                             absl::StrCat("cudaStreamCreateWithFlags for ", owner)));
  s.cuda_ = std::move(cuda);
  return s;
}

CudaStream& CudaStream::operator=(CudaStream&& o) noexcept {
  if (this != &o) {
    Reset();
    cuda_ = std::move(o.cuda_);
    stream_ = std::exchange(o.stream_, nullptr);
  }
  return *this;
}

void CudaStream::Reset() {
  if (stream_ != nullptr) LogIfError(*cuda_, cuda_->StreamDestroy(stream_), "cudaStreamDestroy");
  stream_ = nullptr;
}

absl::StatusOr<CudaEvent> CudaEvent::Create(std::shared_ptr<CudaApi> cuda) {
  CudaEvent e;
  RETURN_IF_ERROR(CudaStatus(*cuda, cuda->EventCreate(&e.event_), "cudaEventCreateWithFlags"));
  e.cuda_ = std::move(cuda);
  return e;
}

CudaEvent& CudaEvent::operator=(CudaEvent&& o) noexcept {
  if (this != &o) {
    Reset();
    cuda_ = std::move(o.cuda_);
    event_ = std::exchange(o.event_, nullptr);
  }
  return *this;
}

void CudaEvent::Reset() {
  if (event_ != nullptr) LogIfError(*cuda_, cuda_->EventDestroy(event_), "cudaEventDestroy");
  event_ = nullptr;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(std::shared_ptr<CudaApi> cuda, size_t bytes,
                                                    absl::string_view what, bool pinned_host) {
  DeviceBuffer b;
  const size_t n = bytes == 0 ? 1 : bytes;
  RETURN_IF_ERROR(CudaStatus(*cuda,
                             pinned_host ? cuda->MallocHost(&b.ptr_, n) : cuda->Malloc(&b.ptr_, n),
                             absl::StrCat(pinned_host ? "cudaMallocHost" : "cudaMalloc", " of ",
                                          bytes, " bytes for ", what)));
  b.pinned_host_ = pinned_host;
  b.bytes_ = bytes;
  b.cuda_ = std::move(cuda);
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    cuda_ = std::move(o.cuda_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    pinned_host_ = o.pinned_host_;
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) {
    LogIfError(*cuda_, pinned_host_ ? cuda_->FreeHost(ptr_) : cuda_->Free(ptr_),
               pinned_host_ ? "cudaFreeHost" : "cudaFree");
  }
  ptr_ = nullptr;
}

absl::Status WaitForStream(const std::shared_ptr<CudaApi>& cuda, cudaStream_t stream,
                           absl::Time deadline, absl::string_view where) {
  ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::Create(cuda));
  RETURN_IF_ERROR(CudaStatus(*cuda, cuda->EventRecord(done.get(), stream),
                             absl::StrCat("cudaEventRecord", where)));
  return PollUntil(deadline, [&]() -> std::optional<absl::Status> {
    const cudaError_t q = cuda->EventQuery(done.get());
    if (q == cudaErrorNotReady) return std::nullopt;
    return CudaStatus(*cuda, q, absl::StrCat("cudaEventQuery", where));
  });
}

}  // namespace braid::nccl
