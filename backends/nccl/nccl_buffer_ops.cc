#include "backends/nccl/nccl_buffer_ops.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/nccl/cuda_handles.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/kernels/bucket_convert.h"
#include "backends/nccl/poll.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::nccl {

std::string NcclBufferOps::What(absl::string_view op) const {
  return absl::StrCat(op, " on the stream of group '", c_.group_name, "'");
}

absl::Status NcclBufferOps::SetDevice() {
  CudaApi& cuda = *c_.apis.cuda;
  return CudaStatus(cuda, cuda.SetDevice(c_.device), What("cudaSetDevice"));
}

absl::StatusOr<OwnedBuffer> NcclBufferOps::Allocate(size_t bytes, absl::string_view what) {
  RETURN_IF_ERROR(SetDevice());
  std::shared_ptr<CudaApi> cuda = c_.apis.cuda;
  void* p = nullptr;
  RETURN_IF_ERROR(CudaStatus(*cuda, cuda->Malloc(&p, bytes == 0 ? 1 : bytes),
                             absl::StrCat("cudaMalloc of ", bytes, " bytes for ", what)));
  return OwnedBuffer(p, bytes, [cuda](void* q) {
    const cudaError_t rc = cuda->Free(q);
    if (rc != cudaSuccess) Log().error("cudaFree: {}", cuda->ErrorString(rc));
  });
}

absl::StatusOr<OwnedBuffer> NcclBufferOps::AllocateHost(size_t bytes, absl::string_view what) {
  RETURN_IF_ERROR(SetDevice());
  std::shared_ptr<CudaApi> cuda = c_.apis.cuda;
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = nullptr;
  RETURN_IF_ERROR(CudaStatus(*cuda, cuda->MallocHost(&p, rounded),
                             absl::StrCat("cudaMallocHost of ", rounded, " bytes for ", what)));
  return OwnedBuffer(p, rounded, [cuda](void* q) {
    const cudaError_t rc = cuda->FreeHost(q);
    if (rc != cudaSuccess) Log().error("cudaFreeHost: {}", cuda->ErrorString(rc));
  });
}

absl::Status NcclBufferOps::Zero(void* dst, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(SetDevice());
  CudaApi& cuda = *c_.apis.cuda;
  return CudaStatus(cuda, cuda.MemsetAsync(dst, 0, bytes, stream_.load()), What("cudaMemsetAsync"));
}

absl::Status NcclBufferOps::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return absl::OkStatus();
  RETURN_IF_ERROR(SetDevice());
  CudaApi& cuda = *c_.apis.cuda;
  return CudaStatus(cuda, cuda.MemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_.load()),
                    What("cudaMemcpyAsync"));
}

absl::Status NcclBufferOps::KernelError(int rc, absl::string_view what) const {
  return absl::InternalError(
      absl::StrCat(What(what), ": CUDA error ", rc, ": ", c_.apis.kernels->ErrorString(rc)));
}

absl::Status NcclBufferOps::CastScale(const void* src, DType src_type, void* dst, DType dst_type,
                                      size_t n, const ScaleSpec& scale) {
  if (n == 0) return absl::OkStatus();
  const bool scaled = scale.apply_mul || scale.div > 0;
  if (src_type == dst_type && !scaled) return Copy(dst, src, n * DTypeSize(src_type));
  const int st = static_cast<int>(src_type), dt = static_cast<int>(dst_type);
  auto what = [&] {  // built only for an error: no allocation per bucket
    return absl::StrCat("cast kernel (", DTypeName(src_type), " -> ", DTypeName(dst_type), ", ", n,
                        " elements", scale.apply_mul ? absl::StrCat(", * ", scale.mul) : "",
                        scale.div > 0 ? absl::StrCat(", / ", scale.div) : "", ")");
  };
  if (!kernels::ValidDType(st) || !kernels::ValidDType(dt)) {
    return absl::InvalidArgumentError(absl::StrCat(What(what()), ": f32, bf16, f16 only"));
  }
  if (c_.apis.kernels == nullptr) {
    return absl::UnimplementedError(absl::StrCat(What(what()), ": no kernels (NcclApis::kernels)"));
  }
  RETURN_IF_ERROR(SetDevice());
  // ScaleSpec as the host's braid::CastScale takes it: mul rounded to f32 here, div converted
  // to f32 by the element rule (kernels/bucket_convert.h, CastScaleElement).
  kernels::ScaleArgs args;
  args.apply_mul = scale.apply_mul ? 1 : 0;
  args.mul = static_cast<float>(scale.mul);
  args.div = scale.div;
  const int rc = c_.apis.kernels->CastScale(src, st, dst, dt, n, args, stream_.load());
  return rc == 0 ? absl::OkStatus() : KernelError(rc, what());
}

absl::Status NcclBufferOps::Add(const void* a, const void* b, void* dst, size_t n, DType dtype) {
  if (n == 0) return absl::OkStatus();
  const int t = static_cast<int>(dtype);
  auto what = [&] { return absl::StrCat("add kernel (", DTypeName(dtype), ", ", n, " elements)"); };
  if (!kernels::ValidDType(t)) {
    return absl::InvalidArgumentError(absl::StrCat(What(what()), ": f32, bf16, f16 only"));
  }
  if (c_.apis.kernels == nullptr) {
    return absl::UnimplementedError(absl::StrCat(What(what()), ": no kernels (NcclApis::kernels)"));
  }
  RETURN_IF_ERROR(SetDevice());
  const int rc = c_.apis.kernels->Add(a, b, dst, n, t, stream_.load());
  return rc == 0 ? absl::OkStatus() : KernelError(rc, what());
}

absl::Status NcclBufferOps::WaitFor(DeviceEvent event) {
  if (!event) return absl::OkStatus();
  RETURN_IF_ERROR(SetDevice());
  CudaApi& cuda = *c_.apis.cuda;
  return CudaStatus(cuda,
                    cuda.StreamWaitEvent(stream_.load(), static_cast<cudaEvent_t>(event.handle)),
                    What("cudaStreamWaitEvent"));
}

absl::Status NcclBufferOps::Synchronize(absl::Time deadline) {
  RETURN_IF_ERROR(SetDevice());
  absl::Status s = WaitForStream(c_.apis.cuda, stream_.load(), deadline, What(""));
  if (absl::IsDeadlineExceeded(s)) {
    s = absl::DeadlineExceededError(
        absl::StrCat(What("synchronizing buffer operations"), ": not done by the deadline"));
  }
  return s;
}

absl::Status NcclBufferOps::CompleteAfter(const WorkPtr& work, absl::Time deadline) {
  RETURN_IF_ERROR(SetDevice());
  CudaApi& cuda = *c_.apis.cuda;
  ASSIGN_OR_RETURN(CudaEvent done, CudaEvent::Create(c_.apis.cuda));
  RETURN_IF_ERROR(CudaStatus(cuda, cuda.EventRecord(done.get(), stream_.load()),
                             What(absl::StrCat("cudaEventRecord for ", work->info().Describe()))));
  work->set_device_event(DeviceEvent{done.get()});
  CompletionPoller::Tracked t;
  t.works.push_back(work);
  t.event = std::move(done);
  t.comm = c_.comm;
  t.deadline = deadline;
  t.timeout = deadline - absl::Now();
  t.keep_alive = c_.keep_alive;
  c_.poller->Track(std::move(t));
  return absl::OkStatus();
}

}  // namespace braid::nccl
