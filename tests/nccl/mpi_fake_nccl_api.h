// MpiFakeNcclApi: NCCL's contract on the fake device (fake_cuda_api.h) across *processes*: one
// rank per process, the data moving through MPI. It lets the nccl backend run as a real
// multi-process job on CPU — under mpirun, and across the hosts of the multi-host test bed
// (tests/hosts/) — which the in-process FakeNcclApi cannot.
//
//   MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...);   // Braid's mpi backend shares MPI
//   auto cuda = std::make_shared<FakeCudaApi>();
//   NcclApis apis{cuda, std::make_shared<MpiFakeNcclApi>(cuda),
//                 std::make_shared<FakeKernelApi>(cuda)};
//   ASSIGN_OR_RETURN(auto nccl, NcclBackend::CreateWithBootstrap(apis, mpi_world, config));
//
// Communicators. CommInitRankConfig(nranks, id, rank) is collective over MPI_COMM_WORLD (every
// process calls it, as when all ranks of a job make their world communicator): a split by the
// id's hash, keyed by `rank`; the result must have nranks processes (else ncclInvalidUsage).
// CommSplit is MPI_Comm_split of the parent's communicator (NCCL_SPLIT_NOCOLOR: no child).
// Communicators are blocking-mode in effect: every call completes its setup before returning
// ncclSuccess (legal for nonblocking communicators as well).
//
// Collectives. Each call becomes an item on its fake stream, so it reads its input only once
// the stream reached it (after the memcpys and kernels queued before it). Ranks match
// collectives by call order, as NCCL does: the item of a communicator's k-th call starts its
// MPI operation only after calls 0..k-1 started theirs, whichever stream gets there first.
// The data: every rank's input is all-gathered (MPI_Iallgather of raw bytes; a pre-mul-sum's
// scalar travels with it) and each rank computes its output locally with fake_nccl_reduce.h, in
// rank order with NCCL's rounding — the same arithmetic as the in-process fake, so results are
// comparable bit for bit with tests/collective_check.h's serial reference. Broadcast is
// MPI_Ibcast. Not modelled: async errors, aborts of peers (CommAbort only frees this rank's
// communicator), ncclInProgress states.
#ifndef BRAID_TESTS_NCCL_MPI_FAKE_NCCL_API_H_
#define BRAID_TESTS_NCCL_MPI_FAKE_NCCL_API_H_

#include <mpi.h>

#include <map>
#include <memory>
#include <string>

#include "backends/nccl/nccl_api.h"
#include "tests/nccl/fake_cuda_api.h"

namespace braid::nccl::testing {

class MpiFakeNcclApi : public NcclApi {
 public:
  explicit MpiFakeNcclApi(std::shared_ptr<FakeCudaApi> cuda);
  ~MpiFakeNcclApi() override;

  ncclResult_t GetUniqueId(ncclUniqueId* id) override;
  ncclResult_t CommInitRankConfig(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank,
                                  ncclConfig_t* config) override;
  ncclResult_t CommSplit(ncclComm_t comm, int color, int key, ncclComm_t* child,
                         ncclConfig_t* config) override;
  ncclResult_t CommFinalize(ncclComm_t comm) override;
  ncclResult_t CommDestroy(ncclComm_t comm) override;
  ncclResult_t CommAbort(ncclComm_t comm) override;
  ncclResult_t CommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) override;
  ncclResult_t CommCount(ncclComm_t comm, int* count) override;
  ncclResult_t CommUserRank(ncclComm_t comm, int* rank) override;
  const char* GetErrorString(ncclResult_t result) override;
  const char* GetLastError(ncclComm_t comm) override;
  ncclResult_t GroupStart() override;
  ncclResult_t GroupEnd() override;
  ncclResult_t AllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                         ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t ReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t AllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                         ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t Broadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                         ncclComm_t comm, cudaStream_t stream) override;
  ncclResult_t RedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                    ncclScalarResidence_t residence, ncclComm_t comm) override;
  ncclResult_t RedOpDestroy(ncclRedOp_t op, ncclComm_t comm) override;

  int executed_collectives() const;  // completed on this rank

 private:
  struct Comm;
  struct Op;

  Comm* FindLocked(ncclComm_t c) const;
  ncclResult_t EnqueueLocked(Comm* c, std::shared_ptr<Op> op, cudaStream_t stream);
  // AllReduce (scatter = false) and ReduceScatter (count: per-rank output elements).
  ncclResult_t ReductionLocked(bool scatter, const void* send, void* recv, size_t count,
                               ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
  bool StepLocked(Comm* c, Op* op);  // the stream item: true once done
  ncclResult_t NewComm(MPI_Comm mpi, ncclComm_t* out);

  const std::shared_ptr<FakeCudaApi> cuda_;
  // Guarded by cuda_->mu().
  std::map<Comm*, std::unique_ptr<Comm>> comms_;
  int executed_ = 0;
};

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_MPI_FAKE_NCCL_API_H_
