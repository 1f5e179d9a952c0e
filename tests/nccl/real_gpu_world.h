// The setup every real-GPU nccl test starts with: find out whether this machine has a GPU
// (skip, naming the CUDA error, when it has none) and make a single-rank `nccl` world on the
// real CUDA/NCCL libraries.
//
//   BRAID_SKIP_WITHOUT_GPU();     // skips without a GPU, fails on another CUDA error
//   auto w = MakeRealSingleRankWorld(/*blocking=*/true);
//   ASSERT_TRUE(w.ok()) << w.status();
#ifndef BRAID_TESTS_NCCL_REAL_GPU_WORLD_H_
#define BRAID_TESTS_NCCL_REAL_GPU_WORLD_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backends/nccl/nccl_backend.h"
#include "comm/group.h"
#include "gtest/gtest.h"

namespace braid::nccl::testing {

// OK with *reason empty: a GPU is there. OK with *reason set ("no GPU: ... (35)"): none (error
// 35 or 100, or no device): skip. Any other CUDA error: Internal naming it.
absl::Status NoGpuReason(std::string* reason);

struct RealSingleRankWorld {
  NcclApis apis;
  std::unique_ptr<NcclBackend> backend;
  std::unique_ptr<Group> world;
};

// A one-rank world from a fresh unique id, 60 s deadlines.
absl::StatusOr<RealSingleRankWorld> MakeRealSingleRankWorld(bool blocking = true);

}  // namespace braid::nccl::testing

// First statement of a GPU test body (or SetUp): skips, naming CUDA's error, on a machine
// without a GPU; fails on any other CUDA error.
#define BRAID_SKIP_WITHOUT_GPU()                                                         \
  do {                                                                                   \
    std::string braid_no_gpu_;                                                           \
    const absl::Status braid_gpu_ = ::braid::nccl::testing::NoGpuReason(&braid_no_gpu_); \
    ASSERT_TRUE(braid_gpu_.ok()) << braid_gpu_;                                          \
    if (!braid_no_gpu_.empty()) GTEST_SKIP() << braid_no_gpu_;                           \
  } while (0)

#endif  // BRAID_TESTS_NCCL_REAL_GPU_WORLD_H_
