#include "comm/buffer_ops.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

#if defined(__SANITIZE_ADDRESS__)
#define BRAID_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BRAID_LSAN 1
#endif
#endif
#ifdef BRAID_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace braid {

OwnedBuffer& OwnedBuffer::operator=(OwnedBuffer&& o) noexcept {
  if (this != &o) {
    Reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    deleter_ = std::move(o.deleter_);
  }
  return *this;
}

void* OwnedBuffer::release() {
  bytes_ = 0;
#ifdef BRAID_LSAN
  // A deliberate leak (something may still write into the memory), logged where it is made:
  // LeakSanitizer must not report it as a lost allocation. Device memory is not LSan's: ignored.
  if (ptr_ != nullptr) __lsan_ignore_object(ptr_);
#endif
  return std::exchange(ptr_, nullptr);
}

void OwnedBuffer::Reset() {
  if (ptr_ != nullptr && deleter_) deleter_(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

namespace {

constexpr size_t kHostAlign = 64;
constexpr size_t kHugePage = size_t{2} << 20;  // x86-64 and aarch64 (4 KiB base pages)
constexpr size_t kHugeFrom = size_t{4} << 20;

bool HugePagesWanted() {
  const char* v = std::getenv("BRAID_HOST_HUGE_PAGES");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

class HostOps final : public BufferOps {
 public:
  bool synchronous() const override { return true; }

  absl::StatusOr<OwnedBuffer> Allocate(size_t bytes, absl::string_view what) override {
    size_t rounded = (bytes + kHostAlign - 1) / kHostAlign * kHostAlign;
    if (rounded == 0) rounded = kHostAlign;
    // Large buffers (buckets, gathered units, pools) start on a huge page and ask the kernel for
    // transparent huge pages (where it offers them on request): 512x fewer page faults when a
    // buffer is first touched, fewer TLB misses in the copies and reductions streaming through
    // it. The size is not rounded (nothing uncounted): a partial last huge page stays small
    // pages. BRAID_HOST_HUGE_PAGES=0 turns it off.
    const bool huge = rounded >= kHugeFrom && HugePagesWanted();
    void* p = nullptr;
    if (posix_memalign(&p, huge ? kHugePage : kHostAlign, rounded) != 0) p = nullptr;
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("allocating ", rounded, " bytes of host memory for ", what));
    }
    if (huge) (void)madvise(p, rounded / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice only
    return OwnedBuffer(p, rounded, [](void* q) { std::free(q); });
  }

  absl::Status Zero(void* dst, size_t bytes) override {
    if (bytes > 0) std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }

  absl::Status CastScale(const void* src, DType src_type, void* dst, DType dst_type, size_t n,
                         const ScaleSpec& scale) override {
    braid::CastScale(src, src_type, dst, dst_type, n, scale);
    return absl::OkStatus();
  }

  absl::Status Add(const void* a, const void* b, void* dst, size_t n, DType dtype) override {
    const void* in[2] = {a, b};
    ReduceInto(in, 2, dst, n, dtype, ReduceOp::Sum(), 2);
    return absl::OkStatus();
  }
  bool can_add() const override { return true; }

  absl::Status WaitFor(DeviceEvent) override { return absl::OkStatus(); }
  absl::Status Synchronize(absl::Time) override { return absl::OkStatus(); }
  absl::Status CompleteAfter(const WorkPtr& work, absl::Time) override {
    work->Complete(absl::OkStatus());
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<OwnedBuffer> BufferOps::AllocateHost(size_t bytes, absl::string_view what) {
  return HostBufferOps().Allocate(bytes, what);
}

BufferOps& HostBufferOps() {
  static HostOps* const ops = new HostOps();  // stateless
  return *ops;
}

}  // namespace braid
