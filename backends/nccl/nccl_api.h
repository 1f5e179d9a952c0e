// NcclApi: the NCCL calls the nccl backend makes, behind one small interface.
//
// As with CudaApi, everything above this file reaches NCCL only through it, so communicator
// life cycles (including the nonblocking ncclInProgress state machine), coalescing, pre-mul-sum
// ops and error paths are unit-tested on CPU against a fake (tests/nccl/fake_nccl_api.h) that
// runs the collectives on host memory across fake ranks in one process.
//
//   std::shared_ptr<NcclApi> nccl = RealNcclApi(options.nccl_library);   // nothing loaded yet
//   RETURN_IF_ERROR(nccl->Ready());        // opens libnccl: FailedPrecondition if it cannot
//   ncclUniqueId id;
//   RETURN_IF_ERROR(NcclStatus(*nccl, nccl->GetUniqueId(&id), "ncclGetUniqueId"));
//
// Each method is the NCCL 2.28 function of the same name (without the `nccl` prefix), same
// arguments and result. Implementations must be thread-safe in the ways NCCL is: group
// brackets (GroupStart/GroupEnd) are per calling thread, CommGetAsyncError may be called from
// another thread than the one issuing calls.
#ifndef BRAID_BACKENDS_NCCL_NCCL_API_H_
#define BRAID_BACKENDS_NCCL_NCCL_API_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "backends/nccl/cuda_api.h"
#include "backends/nccl/kernel_api.h"

namespace braid::nccl {

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // OK when the library is usable. The real API opens libnccl on its first call (once; see
  // nccl_library.h) and returns FailedPrecondition naming the path, the symbol and dlerror()
  // when it cannot; then every other method returns ncclSystemError and GetErrorString says
  // why. Entry points (backend creation, NewUniqueIdBytes) call this first. Fakes: always OK.
  virtual absl::Status Ready() { return absl::OkStatus(); }

  virtual ncclResult_t GetUniqueId(ncclUniqueId* id) = 0;
  virtual ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, const ncclUniqueId& id,
                                          int rank, ncclConfig_t* config) = 0;
  virtual ncclResult_t CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* child,
                                 ncclConfig_t* config) = 0;
  virtual ncclResult_t CommFinalize(ncclComm_t comm) = 0;
  virtual ncclResult_t CommDestroy(ncclComm_t comm) = 0;
  virtual ncclResult_t CommAbort(ncclComm_t comm) = 0;
  virtual ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) = 0;
  virtual ncclResult_t CommCount(ncclComm_t comm, int* count) = 0;
  virtual ncclResult_t CommUserRank(ncclComm_t comm, int* rank) = 0;
  virtual const char* GetErrorString(ncclResult_t result) = 0;  // never null
  virtual const char* GetLastError(ncclComm_t comm) = 0;        // may be empty, never null

  virtual ncclResult_t GroupStart() = 0;
  virtual ncclResult_t GroupEnd() = 0;
  virtual ncclResult_t AllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                 ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t ReduceScatter(const void* send, void* recv, size_t recvcount,
                                     ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream) = 0;
  virtual ncclResult_t AllGather(const void* send, void* recv, size_t sendcount,
                                 ncclDataType_t type, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t Broadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                                 int root, ncclComm_t comm, cudaStream_t stream) = 0;
  virtual ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                            ncclScalarResidence_t residence, ncclComm_t comm) = 0;
  virtual ncclResult_t RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) = 0;
};

// NCCL itself: `library` (default libnccl.so.2; BRAID_NCCL_LIBRARY) opened with dlopen at the
// first call of any method and kept open by the instance. Thread-safe; share one instance.
std::shared_ptr<NcclApi> RealNcclApi(std::string library = "libnccl.so.2");

// The two libraries together, as every object of the backend holds them.
struct NcclApis {
  std::shared_ptr<CudaApi> cuda;
  std::shared_ptr<NcclApi> nccl;
  std::shared_ptr<KernelApi> kernels;  // null: device casts are Unimplemented
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_NCCL_API_H_
