// CudaApi: the CUDA runtime calls the nccl backend makes, behind one small interface.
//
// Everything above this file (streams, events, the completion poller, the group) talks to CUDA
// only through a CudaApi, so the stream/event/future logic runs on CPU against a fake
// (tests/nccl/fake_cuda_api.h) and against the real runtime (RealCudaApi) unchanged.
//
//   std::shared_ptr<CudaApi> cuda = RealCudaApi();
//   cudaStream_t s;
//   RETURN_IF_CUDA_ERROR(*cuda, cuda->StreamCreate(&s));     // see cuda_errors.h
//
// Each method is one runtime call with the same meaning and return value; the comments name
// it. Implementations must be thread-safe (the launching thread and the poller thread call in).
#ifndef BRAID_BACKENDS_NCCL_CUDA_API_H_
#define BRAID_BACKENDS_NCCL_CUDA_API_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

namespace braid::nccl {

class CudaApi {
 public:
  virtual ~CudaApi() = default;

  virtual cudaError_t GetDeviceCount(int* count) = 0;  // cudaGetDeviceCount
  virtual cudaError_t SetDevice(int device) = 0;       // cudaSetDevice
  // cudaStreamCreateWithFlags(s, cudaStreamNonBlocking): never syncs with the legacy stream.
  virtual cudaError_t StreamCreate(cudaStream_t* stream) = 0;
  virtual cudaError_t StreamDestroy(cudaStream_t stream) = 0;  // cudaStreamDestroy
  // cudaEventCreateWithFlags(e, cudaEventDisableTiming).
  virtual cudaError_t EventCreate(cudaEvent_t* event) = 0;
  virtual cudaError_t EventDestroy(cudaEvent_t event) = 0;                      // cudaEventDestroy
  virtual cudaError_t EventRecord(cudaEvent_t event, cudaStream_t stream) = 0;  // cudaEventRecord
  // cudaEventQuery: cudaSuccess once the work before the record has run, cudaErrorNotReady
  // before that, another error when the device failed.
  // cudaErrorNotReady leaves no error behind for the thread's next cudaGetLastError().
  virtual cudaError_t EventQuery(cudaEvent_t event) = 0;
  virtual cudaError_t StreamWaitEvent(cudaStream_t stream, cudaEvent_t event) = 0;  // flags 0
  virtual cudaError_t Malloc(void** ptr, size_t bytes) = 0;                         // cudaMalloc
  virtual cudaError_t Free(void* ptr) = 0;                                          // cudaFree
  virtual cudaError_t MallocHost(void** ptr, size_t bytes) = 0;  // cudaMallocHost (pinned)
  virtual cudaError_t FreeHost(void* ptr) = 0;                   // cudaFreeHost
  virtual cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                  cudaStream_t stream) = 0;  // cudaMemcpyAsync
  virtual cudaError_t MemsetAsync(void* dst, int value, size_t bytes,
                                  cudaStream_t stream) = 0;  // cudaMemsetAsync
  virtual const char* ErrorString(cudaError_t error) = 0;    // cudaGetErrorString, never null
};

// The CUDA runtime itself (libcudart). Stateless; one shared instance is fine everywhere.
std::shared_ptr<CudaApi> RealCudaApi();

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_CUDA_API_H_
