// FakeNcclApi: NCCL's contract, executed on host memory across fake ranks of one process.
//
// Ranks are threads; each makes its communicator with CommInitRankConfig and the same unique
// id (the fake's GetUniqueId makes distinct ids). A collective becomes an item on the caller's
// fake stream (FakeCudaApi); it is executed, for all ranks at once, when the last rank's item
// runs, in rank order with f32 accumulation (comm/reduce_kernels.h), so results are comparable
// bit for bit with the serial reference of tests/collective_check.h. (Deliberate difference
// from real NCCL: ncclAvg is computed as sum-then-divide, like the reference; real NCCL
// multiplies by 1/n first.) Mismatched calls across ranks become an asynchronous error.
//
// The fake enforces NCCL's rules and records every breach in violations(): a call on a
// nonblocking communicator while it is ncclInProgress, any use after finalize/destroy/abort,
// an unbalanced group bracket, an unknown pre-mul-sum op, a bad config. Nonblocking
// communicators return ncclInProgress from init, split, finalize, ncclGroupEnd and bare
// collectives, and stay in progress for in_progress_polls() polls of ncclCommGetAsyncError
// (init: until every rank joined; split: until every rank split). Their collectives reach the
// stream only when the state leaves ncclInProgress, as in NCCL, so a completion event recorded
// too early would complete before the collective.
//
//   auto cuda = std::make_shared<FakeCudaApi>();
//   auto nccl = std::make_shared<FakeNcclApi>(cuda);
//   nccl->SetInProgressPolls(5);
//   nccl->InjectAsyncError(comm, ncclRemoteError, "peer 3 went away");
//   nccl->FailNextCall("GroupEnd", ncclInternalError);
//   EXPECT_THAT(nccl->violations(), IsEmpty());
#ifndef BRAID_TESTS_NCCL_FAKE_NCCL_API_H_
#define BRAID_TESTS_NCCL_FAKE_NCCL_API_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/nccl/nccl_api.h"
#include "tests/nccl/fake_cuda_api.h"

namespace braid::nccl::testing {

class FakeNcclApi : public NcclApi {
 public:
  explicit FakeNcclApi(std::shared_ptr<FakeCudaApi> cuda);
  ~FakeNcclApi() override;

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

  // Knobs -------------------------------------------------------------------------------------
  void SetInProgressPolls(int polls);
  // From now on CommGetAsyncError(comm) reports `rc`; GetLastError(comm) returns `text`.
  void InjectAsyncError(ncclComm_t comm, ncclResult_t rc, std::string text);
  // The next call of `name` ("AllReduce", "GroupEnd", "CommSplit", "CommFinalize",
  // "RedOpCreatePreMulSum", "CommInitRankConfig", ...) on any thread returns `rc`.
  void FailNextCall(std::string name, ncclResult_t rc);

  // Observations ------------------------------------------------------------------------------
  std::vector<std::string> violations() const;
  int group_ends() const;                  // outermost ncclGroupEnd calls
  std::vector<int> ops_per_group() const;  // collectives in each outermost bracket
  int premul_created() const;
  int premul_destroyed() const;
  std::vector<double> premul_scalars() const;  // as NCCL decodes them, in creation order
  int live_premul_ops() const;                 // on communicators not yet freed
  int comms_created() const;
  int comms_finalized() const;  // destroyed after a completed finalize
  int comms_aborted() const;
  int live_comms() const;            // neither destroyed nor aborted
  int executed_collectives() const;  // cross-rank executions (one per matched call)

 private:
  struct Comm;
  struct Clique;
  struct Op;
  struct SplitSlot;
  struct ThreadGroup {
    int depth = 0;
    std::vector<Op> ops;
  };

  Comm* FindLocked(ncclComm_t c) const;
  ncclResult_t CheckCallLocked(ncclComm_t c, const char* name, Comm** out);
  ncclResult_t FailInjectedLocked(const char* name);
  bool BusyLocked(const Comm& c) const;
  void ViolationLocked(std::string what);
  ncclResult_t CollectiveLocked(Op op, const char* name);
  void SubmitLocked(Comm* c, Op op);
  bool PostLocked(Clique* clique, uint64_t index, int rank, const Op& op);
  void ExecuteLocked(Clique* clique, uint64_t index);
  void ResolveSplitLocked(Clique* parent, uint64_t index);
  Comm* NewCommLocked(Clique* clique, int rank, bool blocking, std::string name);

  const std::shared_ptr<FakeCudaApi> cuda_;
  std::condition_variable cv_;  // with cuda_->mu(): blocking init / split
  // All below guarded by cuda_->mu().
  std::map<Comm*, std::unique_ptr<Comm>> comms_;  // kept after free, to detect use after free
  std::map<std::string, std::unique_ptr<Clique>> cliques_;
  std::map<std::thread::id, ThreadGroup> groups_;
  std::map<std::string, ncclResult_t> fail_next_;
  std::vector<std::string> violations_;
  std::vector<int> ops_per_group_;
  std::vector<double> premul_scalars_;
  int in_progress_polls_ = 2;
  int next_id_ = 0;
  int group_ends_ = 0;
  int premul_created_ = 0;
  int premul_destroyed_ = 0;
  int comms_created_ = 0;
  int comms_finalized_ = 0;
  int comms_aborted_ = 0;
  int executed_ = 0;
};

}  // namespace braid::nccl::testing

#endif  // BRAID_TESTS_NCCL_FAKE_NCCL_API_H_
