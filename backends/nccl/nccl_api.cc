#include "backends/nccl/nccl_api.h"

#include <mutex>
#include <utility>

#include "backends/nccl/nccl_library.h"

namespace braid::nccl {
namespace {

// Every call goes through the library opened at the first call; while it could not be opened,
// calls return ncclSystemError and GetErrorString returns the reason.
class RealNccl final : public NcclApi {
 public:
  explicit RealNccl(std::string library) : library_(std::move(library)) {}

  absl::Status Ready() override {
    Load();
    return lib_.status();
  }

  ncclResult_t GetUniqueId(ncclUniqueId* id) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->GetUniqueId(id) : ncclSystemError;
  }
  ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                                  ncclConfig_t* config) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->CommInitRankConfig(comm, nranks, id, rank, config) : ncclSystemError;
  }
  ncclResult_t CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* child,
                         ncclConfig_t* config) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->CommSplit(comm, color, key, child, config) : ncclSystemError;
  }
  ncclResult_t CommFinalize(ncclComm_t comm) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->CommFinalize(comm) : ncclSystemError;
  }
  ncclResult_t CommDestroy(ncclComm_t comm) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->CommDestroy(comm) : ncclSystemError;
  }
  ncclResult_t CommAbort(ncclComm_t comm) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->CommAbort(comm) : ncclSystemError;
  }
  ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->CommGetAsyncError(comm, async_error) : ncclSystemError;
  }
  ncclResult_t CommCount(ncclComm_t comm, int* count) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->CommCount(comm, count) : ncclSystemError;
  }
  ncclResult_t CommUserRank(ncclComm_t comm, int* rank) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->CommUserRank(comm, rank) : ncclSystemError;
  }
  const char* GetErrorString(ncclResult_t result) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->GetErrorString(result) : load_error_.c_str();
  }
  const char* GetLastError(ncclComm_t comm) override {
    const NcclFunctions* f = Fn();
    const char* s = f != nullptr ? f->GetLastError(comm) : nullptr;
    return s != nullptr ? s : "";
  }
  ncclResult_t GroupStart() override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->GroupStart() : ncclSystemError;
  }
  ncclResult_t GroupEnd() override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->GroupEnd() : ncclSystemError;
  }
  ncclResult_t AllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->AllReduce(send, recv, count, type, op, comm, stream) : ncclSystemError;
  }
  ncclResult_t ReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->ReduceScatter(send, recv, recvcount, type, op, comm, stream)
                        : ncclSystemError;
  }
  ncclResult_t AllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                         ncclComm_t comm, cudaStream_t stream) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->AllGather(send, recv, sendcount, type, comm, stream) : ncclSystemError;
  }
  ncclResult_t Broadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                         ncclComm_t comm, cudaStream_t stream) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->Broadcast(send, recv, count, type, root, comm, stream)
                        : ncclSystemError;
  }
  ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                    ncclScalarResidence_t residence, ncclComm_t comm) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->RedOpCreatePreMulSum(op, scalar, type, residence, comm)
                        : ncclSystemError;
  }
  ncclResult_t RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) override {
    const NcclFunctions* f = Fn();
    return f != nullptr ? f->RedOpDestroy(op, comm) : ncclSystemError;
  }

 private:
  void Load() {
    std::call_once(once_, [this] {
      lib_ = NcclLibrary::Open(library_);
      if (!lib_.ok()) load_error_ = std::string(lib_.status().message());
    });
  }
  // The resolved functions, or null when the library could not be opened.
  const NcclFunctions* Fn() {
    Load();
    return lib_.ok() ? &(*lib_)->fn() : nullptr;
  }

  const std::string library_;
  std::once_flag once_;
  // Written once inside once_, read-only after it.
  absl::StatusOr<std::unique_ptr<NcclLibrary>> lib_{absl::UnknownError("not loaded yet")};
  std::string load_error_;
};

}  // namespace

std::shared_ptr<NcclApi> RealNcclApi(std::string library) {
  return std::make_shared<RealNccl>(std::move(library));
}

}  // namespace braid::nccl
