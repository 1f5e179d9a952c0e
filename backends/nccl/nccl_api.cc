#include "backends/nccl/nccl_api.h"

namespace braid::nccl {
namespace {

class RealNccl final : public NcclApi {
 public:
  ncclResult_t GetUniqueId(ncclUniqueId* id) override { return ncclGetUniqueId(id); }
  ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                                  ncclConfig_t* config) override {
    return ncclCommInitRankConfig(comm, nranks, id, rank, config);
  }
  ncclResult_t CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* child,
                         ncclConfig_t* config) override {
    return ncclCommSplit(comm, color, key, child, config);
  }
  ncclResult_t CommFinalize(ncclComm_t comm) override { return ncclCommFinalize(comm); }
  ncclResult_t CommDestroy(ncclComm_t comm) override { return ncclCommDestroy(comm); }
  ncclResult_t CommAbort(ncclComm_t comm) override { return ncclCommAbort(comm); }
  ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) override {
    return ncclCommGetAsyncError(comm, async_error);
  }
  ncclResult_t CommCount(ncclComm_t comm, int* count) override {
    return ncclCommCount(comm, count);
  }
  ncclResult_t CommUserRank(ncclComm_t comm, int* rank) override {
    return ncclCommUserRank(comm, rank);
  }
  const char* GetErrorString(ncclResult_t result) override { return ncclGetErrorString(result); }
  const char* GetLastError(ncclComm_t comm) override {
    const char* s = ncclGetLastError(comm);
    return s != nullptr ? s : "";
  }
  ncclResult_t GroupStart() override { return ncclGroupStart(); }
  ncclResult_t GroupEnd() override { return ncclGroupEnd(); }
  ncclResult_t AllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    return ncclAllReduce(send, recv, count, type, op, comm, stream);
  }
  ncclResult_t ReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    return ncclReduceScatter(send, recv, recvcount, type, op, comm, stream);
  }
  ncclResult_t AllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                         ncclComm_t comm, cudaStream_t stream) override {
    return ncclAllGather(send, recv, sendcount, type, comm, stream);
  }
  ncclResult_t Broadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                         int root, ncclComm_t comm, cudaStream_t stream) override {
    return ncclBroadcast(send, recv, count, type, root, comm, stream);
  }
  ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                    ncclScalarResidence_t residence, ncclComm_t comm) override {
    return ncclRedOpCreatePreMulSum(op, scalar, type, residence, comm);
  }
  ncclResult_t RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) override {
    return ncclRedOpDestroy(op, comm);
  }
};

}  // namespace

std::shared_ptr<NcclApi> RealNcclApi() { return std::make_shared<RealNccl>(); }

}  // namespace braid::nccl
