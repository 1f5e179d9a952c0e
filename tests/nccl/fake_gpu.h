// Test harness for the nccl backend on fakes: a fake device shared by N fake ranks (threads of
// this process), each with its own NcclBackend and world group, as one process per GPU would
// have. RunFakeRanks joins every rank before returning; ExpectClean then checks that nothing
// leaked and NCCL's rules were never broken.
//
//   FakeGpu gpu;
//   RunFakeRanks(gpu, 4, FakeConfig(), [&](NcclGroup& world) {
//     EXPECT_OK(RunAndCheck(world, c));
//   });
//   ExpectClean(gpu);
#ifndef BRAID_TESTS_NCCL_FAKE_GPU_H_
#define BRAID_TESTS_NCCL_FAKE_GPU_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/nccl/nccl_group.h"
#include "tests/nccl/fake_cuda_api.h"
#include "tests/nccl/fake_kernel_api.h"
#include "tests/nccl/fake_nccl_api.h"

namespace braid::nccl::testing {

struct FakeGpu {
  std::shared_ptr<FakeCudaApi> cuda = std::make_shared<FakeCudaApi>();
  std::shared_ptr<FakeNcclApi> nccl = std::make_shared<FakeNcclApi>(cuda);
  std::shared_ptr<FakeKernelApi> kernels = std::make_shared<FakeKernelApi>(cuda);
  NcclApis apis() const { return NcclApis{cuda, nccl, kernels}; }
};

NcclBackendConfig FakeConfig(bool blocking = true, absl::Duration timeout = absl::Seconds(60));

// body(world group of rank r) on one thread per rank; the rank's backend and group are
// destroyed on that thread afterwards (so their teardown runs concurrently, as across
// processes).
void RunFakeRanks(FakeGpu& gpu, int n, const NcclBackendConfig& config,
                  const std::function<void(NcclGroup&)>& body);

// No live streams, events, buffers, communicators or pre-mul-sum ops; no NCCL rule broken; no
// CUDA handle misused.
void ExpectClean(const FakeGpu& gpu);

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_FAKE_GPU_H_
