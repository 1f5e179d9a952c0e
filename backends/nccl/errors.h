// CUDA and NCCL results turned into absl::Status, once, at the edge of the nccl backend.
//
//   RETURN_IF_ERROR(CudaStatus(*cuda, cuda->StreamCreate(&s), "cudaStreamCreateWithFlags"));
//   RETURN_IF_ERROR(NcclStatus(*nccl, rc, "ncclAllReduce", comm));   // adds ncclGetLastError
//
// The status carries the failed call's text and the library's own message (and, for NCCL,
// the communicator's last-error text when one is given). Codes: CUDA "no device" / "no driver"
// (100, 35) -> FailedPrecondition, invalid value -> InvalidArgument, out of memory ->
// ResourceExhausted; NCCL invalid argument / usage -> InvalidArgument, remote error ->
// Unavailable; anything else -> Internal. Nothing else in the backend looks at raw codes.
#ifndef BRAID_BACKENDS_NCCL_ERRORS_H_
#define BRAID_BACKENDS_NCCL_ERRORS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "backends/nccl/cuda_api.h"
#include "backends/nccl/nccl_api.h"

namespace braid::nccl {

// OK for cudaSuccess; otherwise an error naming `call` and CUDA's description.
absl::Status CudaStatus(CudaApi& cuda, cudaError_t rc, absl::string_view call);

// OK for ncclSuccess; otherwise an error naming `call`, NCCL's description and, when `comm` is
// given, ncclGetLastError(comm). ncclInProgress is not OK here: callers that expect it (the
// nonblocking state machine in nccl_comm.h) test for it before converting.
absl::Status NcclStatus(NcclApi& nccl, ncclResult_t rc, absl::string_view call,
                        ncclComm_t comm = nullptr);

// True when `rc` means "this machine has no usable GPU" (cudaErrorNoDevice,
// cudaErrorInsufficientDriver): tests skip on it, the backend factory reports it.
inline bool IsNoDevice(cudaError_t rc) {
  return rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver;
}

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_ERRORS_H_
