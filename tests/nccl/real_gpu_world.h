// The setup every real-GPU nccl test starts with: find out whether this machine has a GPU
// (skip, naming the CUDA error, when it has none) and make a single-rank `nccl` world on the
// real CUDA/NCCL libraries.
//
//   std::string no_gpu;
//   absl::Status st = NoGpuReason(&no_gpu);
//   ASSERT_TRUE(st.ok()) << st;                  // a CUDA error other than "no device"
//   if (!no_gpu.empty()) GTEST_SKIP() << no_gpu;
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

#endif  // BRAID_TESTS_NCCL_REAL_GPU_WORLD_H_
