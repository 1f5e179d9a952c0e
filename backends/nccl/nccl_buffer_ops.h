// NcclBufferOps: BufferOps (comm/buffer_ops.h) on device memory, queued on an NcclGroup's comm
// stream, so they are ordered with the group's collectives without the host waiting.
//
//   BufferOps& ops = nccl_group->buffer_ops();
//   RETURN_IF_ERROR(ops.WaitFor(ready));                    // cudaStreamWaitEvent
//   RETURN_IF_ERROR(ops.CastScale(bucket, DType::kBF16, staging, DType::kF32, n, {}));
//   ... collective on the group reading `staging` ...
//   RETURN_IF_ERROR(ops.CompleteAfter(work, deadline));     // event + the completion poller
//
// Zero: cudaMemsetAsync; Copy: cudaMemcpyAsync (cudaMemcpyDefault, so either side may be host
// memory); CastScale: the cast kernel (KernelApi) with the ScaleSpec's mul and div applied as
// the host applies them (f32, mul then a true division: the reducer's f16 post-divide), bit
// for bit with HostBufferOps (element rule: kernels/bucket_convert.h); f64 is InvalidArgument.
// Add: the add kernel (f32 accumulation, one rounding, as the host's ReduceInto: the reducer's
// reduce_scatter_only partial sums); can_add() is true when there are kernels (NcclApis).
// Synchronize polls an event recorded on the stream
// (deadline-bounded); CompleteAfter hands one to the group's CompletionPoller, which fails the
// Work (and aborts the communicator, as for a collective) at the deadline.
// Each call first sets the calling thread's device (calls come from the framework's threads
// and the poller's).
#ifndef BRAID_BACKENDS_NCCL_NCCL_BUFFER_OPS_H_
#define BRAID_BACKENDS_NCCL_NCCL_BUFFER_OPS_H_

#include <atomic>
#include <memory>
#include <string>

#include "backends/nccl/completion_poller.h"
#include "backends/nccl/nccl_api.h"
#include "backends/nccl/nccl_comm.h"
#include "comm/buffer_ops.h"

namespace braid::nccl {

struct NcclBufferOpsConfig {
  NcclApis apis;
  std::shared_ptr<CompletionPoller> poller;
  std::shared_ptr<NcclComm> comm;    // whose stream failure aborts, as a collective's would
  cudaStream_t stream = nullptr;     // the group's comm stream (SetStream may replace it)
  std::shared_ptr<void> keep_alive;  // the stream's owner, held by tracked completions
  int device = 0;
  std::string group_name;  // names the group in errors
};

class NcclBufferOps final : public BufferOps {
 public:
  explicit NcclBufferOps(NcclBufferOpsConfig config) : c_(std::move(config)), stream_(c_.stream) {}

  bool synchronous() const override { return false; }
  absl::StatusOr<OwnedBuffer> Allocate(size_t bytes, absl::string_view what) override;
  // Pinned: cudaMallocHost (64-byte multiples, as host allocations).
  absl::StatusOr<OwnedBuffer> AllocateHost(size_t bytes, absl::string_view what) override;
  absl::Status Zero(void* dst, size_t bytes) override;
  absl::Status Copy(void* dst, const void* src, size_t bytes) override;
  absl::Status CastScale(const void* src, DType src_type, void* dst, DType dst_type, size_t n,
                         const ScaleSpec& scale) override;
  absl::Status Add(const void* a, const void* b, void* dst, size_t n, DType dtype) override;
  bool can_add() const override { return c_.apis.kernels != nullptr; }
  DeviceStream stream() const override { return DeviceStream{stream_.load()}; }
  // Later operations are queued on `stream` (the group's UseStream).
  void SetStream(cudaStream_t stream) { stream_.store(stream); }
  absl::Status WaitFor(DeviceEvent event) override;
  absl::Status Synchronize(absl::Time deadline) override;
  absl::Status CompleteAfter(const WorkPtr& work, absl::Time deadline) override;

 private:
  absl::Status SetDevice();
  // A kernel launcher's failure (a cudaError_t value) as a status naming `what`.
  absl::Status KernelError(int rc, absl::string_view what) const;
  std::string What(absl::string_view op) const;  // "cudaMemsetAsync on group 'world'"

  const NcclBufferOpsConfig c_;
  std::atomic<cudaStream_t> stream_;  // where operations are queued: c_.stream or the caller's
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_NCCL_BUFFER_OPS_H_
