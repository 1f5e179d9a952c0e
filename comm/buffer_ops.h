// BufferOps: the memory operations a scheduler performs on the buffers it hands to a group's
// collectives (bucket storage, reduce-dtype staging, partial sums), done where that memory
// lives. A group returns its own (Group::buffer_ops()): host memory for the CPU backends,
// device memory on the group's comm stream for `nccl`.
//
//   BufferOps& ops = group.buffer_ops();
//   ASSIGN_OR_RETURN(OwnedBuffer bucket, ops.Allocate(bytes, "bucket 3"));
//   RETURN_IF_ERROR(ops.Zero(bucket.get(), bytes));
//   RETURN_IF_ERROR(ops.WaitFor(ready));              // a producer's event (device only)
//   RETURN_IF_ERROR(ops.CastScale(bucket.get(), DType::kBF16, staging, DType::kF32, n, {}));
//   ... a collective on `group` reads `staging` (same stream: ordered after the cast) ...
//   RETURN_IF_ERROR(ops.CompleteAfter(work, deadline));  // host future once the ops ran
//
// Ordering: operations run in issue order with respect to each other and to the group's
// collectives issued after them (device: the comm stream; host: they are done on return, see
// synchronous()). Nothing orders them with another group's stream or the host: WaitFor,
// Synchronize and CompleteAfter do. Methods may be called from any thread; a caller issuing
// from several threads at once gets no order among those calls.
// Errors name the operation; an implementation that lacks an operation returns Unimplemented.
#ifndef BRAID_COMM_BUFFER_OPS_H_
#define BRAID_COMM_BUFFER_OPS_H_

#include <cstddef>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/dtype.h"
#include "comm/reduce_kernels.h"
#include "comm/tensor.h"
#include "comm/work.h"

namespace braid {

// Owns one allocation made by a BufferOps (freed by the deleter it was made with). Move-only.
class OwnedBuffer {
 public:
  using Deleter = std::function<void(void*)>;
  OwnedBuffer() = default;
  OwnedBuffer(void* ptr, size_t bytes, Deleter deleter)
      : ptr_(ptr), bytes_(bytes), deleter_(std::move(deleter)) {}
  OwnedBuffer(OwnedBuffer&& o) noexcept { *this = std::move(o); }
  OwnedBuffer& operator=(OwnedBuffer&& o) noexcept;
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;
  ~OwnedBuffer() { Reset(); }

  char* get() const { return static_cast<char*>(ptr_); }
  size_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }
  // Gives up ownership (the memory leaks): for storage something may still write into.
  void* release();
  void Reset();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Deleter deleter_;
};

class BufferOps {
 public:
  virtual ~BufferOps() = default;

  // True when every operation has taken effect when it returns, and the memory is readable by
  // the host (host memory). False: operations are queued (device).
  virtual bool synchronous() const = 0;
  // At least `bytes` (64-byte aligned), contents unspecified; `what` names it in errors.
  virtual absl::StatusOr<OwnedBuffer> Allocate(size_t bytes, absl::string_view what) = 0;
  // Host memory for staging copies to and from this object's memory (at least `bytes`, 64-byte
  // multiples): page-locked on device implementations (cudaMallocHost), so Copy through it is a
  // DMA the stream queues rather than a synchronous staged copy; plain host memory by default.
  virtual absl::StatusOr<OwnedBuffer> AllocateHost(size_t bytes, absl::string_view what);
  virtual absl::Status Zero(void* dst, size_t bytes) = 0;
  // Non-overlapping; either side may be host memory on device implementations.
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // dst[i] = src[i] converted and scaled as braid::CastScale (comm/reduce_kernels.h), bit for
  // bit; dst may equal src when the dtypes match.
  virtual absl::Status CastScale(const void* src, DType src_type, void* dst, DType dst_type,
                                 size_t n, const ScaleSpec& scale) = 0;
  // dst[i] = a[i] + b[i] as braid::ReduceInto with a sum of {a, b} in that order; dst may
  // alias a or b.
  virtual absl::Status Add(const void* a, const void* b, void* dst, size_t n, DType dtype) = 0;
  // The stream the operations are queued on (device: the group's comm stream), for a caller
  // that queues its own kernels in the same order (the sharded optimizer's step). Null on the
  // host.
  virtual DeviceStream stream() const { return {}; }
  // Whether Add is implemented (callers check before relying on it).
  virtual bool can_add() const = 0;
  // Later operations wait for `event` (a device event a producer recorded; null: nothing).
  virtual absl::Status WaitFor(DeviceEvent event) = 0;
  // Returns once every operation issued so far has run (or the deadline passed: an error).
  virtual absl::Status Synchronize(absl::Time deadline) = 0;
  // Completes `work` with OK once every operation issued so far has run (now, on the host),
  // with an error naming it if they fail or miss the deadline; device implementations also
  // set work->device_event() for consumer streams. An error return means `work` was not
  // touched.
  virtual absl::Status CompleteAfter(const WorkPtr& work, absl::Time deadline) = 0;
};

// Host memory, done on the calling thread (std::memset / std::memcpy / CastScale /
// ReduceInto). Stateless: one instance serves every CPU group. Buffers of 4 MiB and more start
// on a 2 MiB boundary and are advised to transparent huge pages (MADV_HUGEPAGE; no size
// rounding); BRAID_HOST_HUGE_PAGES=0 in the environment turns that off.
BufferOps& HostBufferOps();

}  // namespace braid

#endif  // BRAID_COMM_BUFFER_OPS_H_
