// FakeKernelApi: Braid's bucket kernels on the fake device (fake_cuda_api.h): each launch is
// queued on its fake stream and, when the stream reaches it, runs the CPU reference
// (backends/nccl/kernels/bucket_reference.h), which the real kernels match bit for bit.
//
//   auto cuda = std::make_shared<FakeCudaApi>();
//   auto kernels = std::make_shared<FakeKernelApi>(cuda);
#ifndef BRAID_TESTS_NCCL_FAKE_KERNEL_API_H_
#define BRAID_TESTS_NCCL_FAKE_KERNEL_API_H_

#include <atomic>
#include <memory>

#include "backends/nccl/kernel_api.h"
#include "tests/nccl/fake_cuda_api.h"

namespace braid::nccl::testing {

class FakeKernelApi : public KernelApi {
 public:
  explicit FakeKernelApi(std::shared_ptr<FakeCudaApi> cuda) : cuda_(std::move(cuda)) {}
  int CastScale(const void* src, int src_dtype, void* dst, int dst_dtype, size_t n,
                const kernels::ScaleArgs& scale, cudaStream_t stream) override;
  int Add(const void* a, const void* b, void* dst, size_t n, int dtype,
          cudaStream_t stream) override;
  const char* ErrorString(int code) override;

  int launches() const { return launches_.load(); }          // every kernel
  int scaled_casts() const { return scaled_casts_.load(); }  // casts with a mul or a div
  int adds() const { return adds_.load(); }

 private:
  std::shared_ptr<FakeCudaApi> cuda_;
  std::atomic<int> launches_{0};
  std::atomic<int> scaled_casts_{0};
  std::atomic<int> adds_{0};
};

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_FAKE_KERNEL_API_H_
