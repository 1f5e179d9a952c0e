#include "backends/nccl/cuda_api.h"

#include <cuda_runtime.h>

namespace braid::nccl {
namespace {

class RealCuda final : public CudaApi {
 public:
  cudaError_t GetDeviceCount(int* count) override { return cudaGetDeviceCount(count); }
  cudaError_t SetDevice(int device) override { return cudaSetDevice(device); }
  cudaError_t StreamCreate(cudaStream_t* stream) override {
    return cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking);
  }
  cudaError_t StreamDestroy(cudaStream_t stream) override { return cudaStreamDestroy(stream); }
  cudaError_t EventCreate(cudaEvent_t* event) override {
    return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
  }
  cudaError_t EventDestroy(cudaEvent_t event) override { return cudaEventDestroy(event); }
  cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) override {
    return cudaEventRecord(event, stream);
  }
  cudaError_t EventQuery(cudaEvent_t event) override {
    const cudaError_t rc = cudaEventQuery(event);
    // "Not ready" is no failure, but the runtime also keeps it as this thread's last error,
    // which the next kernel launcher's cudaGetLastError() would then report as its own
    // (PyTorch's CUDAEvent::query clears it the same way).
    if (rc == cudaErrorNotReady) (void)cudaGetLastError();
    return rc;
  }
  cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) override {
    return cudaStreamWaitEvent(stream, event, 0);
  }
  cudaError_t Malloc(void** ptr, size_t bytes) override { return cudaMalloc(ptr, bytes); }
  cudaError_t Free(void* ptr) override { return cudaFree(ptr); }
  cudaError_t MallocHost(void** ptr, size_t bytes) override { return cudaMallocHost(ptr, bytes); }
  cudaError_t FreeHost(void* ptr) override { return cudaFreeHost(ptr); }
  cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                          cudaStream_t stream) override {
    return cudaMemcpyAsync(dst, src, bytes, kind, stream);
  }
  cudaError_t MemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) override {
    return cudaMemsetAsync(dst, value, bytes, stream);
  }
  const char* ErrorString(cudaError_t error) override { return cudaGetErrorString(error); }
};

}  // namespace

std::shared_ptr<CudaApi> RealCudaApi() { return std::make_shared<RealCuda>(); }

}  // namespace braid::nccl
