#include "tests/nccl/real_gpu_world.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/unique_id.h"
#include "comm/status_macros.h"

namespace braid::nccl::testing {

absl::Status NoGpuReason(std::string* reason) {
  reason->clear();
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (IsNoDevice(rc)) {
    *reason = absl::StrCat("no GPU: ", cudaGetErrorString(rc), " (", static_cast<int>(rc), ")");
    return absl::OkStatus();
  }
  if (rc != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(rc)));
  }
  if (n == 0) *reason = "no GPU: device count 0";
  return absl::OkStatus();
}

absl::StatusOr<RealSingleRankWorld> MakeRealSingleRankWorld(bool blocking) {
  RealSingleRankWorld w;
  w.apis = RealApis();
  ASSIGN_OR_RETURN(std::string id, NewUniqueIdBytes(*RealNcclApi()));
  NcclBackendConfig cfg;
  cfg.blocking = blocking;
  cfg.timeout = absl::Seconds(60);
  ASSIGN_OR_RETURN(w.backend, NcclBackend::CreateFromUniqueId(w.apis, id, 1, 0, cfg));
  ASSIGN_OR_RETURN(w.world, w.backend->WorldGroup(0));
  return w;
}

}  // namespace braid::nccl::testing
