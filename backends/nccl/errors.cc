#include "backends/nccl/errors.h"

#include "absl/strings/str_cat.h"

namespace braid::nccl {

absl::Status CudaStatus(CudaApi& cuda, cudaError_t rc, absl::string_view call) {
  if (rc == cudaSuccess) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (IsNoDevice(rc)) {
    code = absl::StatusCode::kFailedPrecondition;
  } else if (rc == cudaErrorInvalidValue) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (rc == cudaErrorMemoryAllocation) {
    code = absl::StatusCode::kResourceExhausted;
  }
  return absl::Status(code, absl::StrCat(call, " failed: ", cuda.ErrorString(rc), " (CUDA error ",
                                         static_cast<int>(rc), ")"));
}

absl::Status NcclStatus(NcclApi& nccl, ncclResult_t rc, absl::string_view call, ncclComm_t comm) {
  if (rc == ncclSuccess) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (rc == ncclInvalidArgument || rc == ncclInvalidUsage) {
    code = absl::StatusCode::kInvalidArgument;
  } else if (rc == ncclRemoteError) {
    code = absl::StatusCode::kUnavailable;
  }
  std::string msg = absl::StrCat(call, " failed: ", nccl.GetErrorString(rc), " (NCCL error ",
                                 static_cast<int>(rc), ")");
  if (comm != nullptr) {
    const absl::string_view last = nccl.GetLastError(comm);
    if (!last.empty()) absl::StrAppend(&msg, ": ", last);
  }
  return absl::Status(code, std::move(msg));
}

}  // namespace braid::nccl
