// RAII owners of CUDA resources for host code that talks to the runtime directly (the CUDA
// optimizer's tests and benchmark): one cudaMalloc allocation, one stream, one event. Each
// creation returns the cudaError_t, so callers can skip cleanly without a device.
#ifndef BRAID_OPTIM_CUDA_OWNERS_H_
#define BRAID_OPTIM_CUDA_OWNERS_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace braid::optim {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  cudaError_t Allocate(size_t bytes) { return cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes); }
  // Allocate, then set every byte to `fill`.
  cudaError_t Allocate(size_t bytes, int fill) {
    const cudaError_t e = Allocate(bytes);
    return e != cudaSuccess ? e : cudaMemset(ptr_, fill, bytes);
  }
  char* get() const { return static_cast<char*>(ptr_); }
  float* f32() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaError_t Create() { return cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() = default;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  cudaError_t Create() { return cudaEventCreate(&event_); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_CUDA_OWNERS_H_
