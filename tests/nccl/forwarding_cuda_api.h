// A CudaApi that forwards every call to another one (the fake): tests derive from it to watch or
// break single calls (nccl_device_context_test tracks each thread's current device,
// nccl_reducer_zero_test fails the memsets).
#ifndef BRAID_TESTS_NCCL_FORWARDING_CUDA_API_H_
#define BRAID_TESTS_NCCL_FORWARDING_CUDA_API_H_

#include <memory>

#include "backends/nccl/cuda_api.h"

namespace braid::nccl::testing {

class ForwardingCudaApi : public CudaApi {
 public:
  explicit ForwardingCudaApi(std::shared_ptr<CudaApi> to) : to_(std::move(to)) {}

  cudaError_t GetDeviceCount(int* count) override { return to_->GetDeviceCount(count); }
  cudaError_t SetDevice(int device) override { return to_->SetDevice(device); }
  cudaError_t StreamCreate(cudaStream_t* s) override { return to_->StreamCreate(s); }
  cudaError_t StreamDestroy(cudaStream_t s) override { return to_->StreamDestroy(s); }
  cudaError_t EventCreate(cudaEvent_t* e) override { return to_->EventCreate(e); }
  cudaError_t EventDestroy(cudaEvent_t e) override { return to_->EventDestroy(e); }
  cudaError_t EventRecord(cudaEvent_t e, cudaStream_t s) override { return to_->EventRecord(e, s); }
  cudaError_t EventQuery(cudaEvent_t e) override { return to_->EventQuery(e); }
  cudaError_t StreamWaitEvent(cudaStream_t s, cudaEvent_t e) override {
    return to_->StreamWaitEvent(s, e);
  }
  cudaError_t Malloc(void** p, size_t n) override { return to_->Malloc(p, n); }
  cudaError_t Free(void* p) override { return to_->Free(p); }
  cudaError_t MallocHost(void** p, size_t n) override { return to_->MallocHost(p, n); }
  cudaError_t FreeHost(void* p) override { return to_->FreeHost(p); }
  cudaError_t MemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k,
                          cudaStream_t st) override {
    return to_->MemcpyAsync(d, s, n, k, st);
  }
  cudaError_t MemsetAsync(void* d, int v, size_t n, cudaStream_t st) override {
    return to_->MemsetAsync(d, v, n, st);
  }
  const char* ErrorString(cudaError_t e) override { return to_->ErrorString(e); }

 private:
  const std::shared_ptr<CudaApi> to_;
};

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_FORWARDING_CUDA_API_H_
