// Devices, opaque device events/streams, and tensor views: what crosses the backend interface.
//
//   TensorView v{ptr, count, DType::kF32, Device::Cpu()};
//   size_t bytes = v.bytes();
//
// A view never owns memory: the caller keeps the buffer alive until the Work that uses it is
// complete (the buffer contract, docs/design/comm.md).
#ifndef BRAID_COMM_TENSOR_H_
#define BRAID_COMM_TENSOR_H_

#include <cstddef>
#include <string>

#include "comm/dtype.h"

namespace braid {

enum class DeviceType : int { kCpu = 0, kCuda = 1 };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device Cpu() { return {DeviceType::kCpu, 0}; }
  static Device Cuda(int i) { return {DeviceType::kCuda, i}; }
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string ToString() const;  // "cpu", "cuda:3"
};

// An opaque device event (e.g. a cudaEvent_t) or stream. Braid never dereferences it on the
// host side; a device backend interprets it. A null handle means "no device dependency".
struct DeviceEvent {
  void* handle = nullptr;
  explicit operator bool() const { return handle != nullptr; }
};
struct DeviceStream {
  void* handle = nullptr;
  explicit operator bool() const { return handle != nullptr; }
};

struct TensorView {
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  Device device = Device::Cpu();

  size_t bytes() const { return count * DTypeSize(dtype); }
};

}  // namespace braid

#endif  // BRAID_COMM_TENSOR_H_
