// CommAbortHub: an nccl world's link to the job's abort domain (comm/abort_domain.h).
//
// Every communicator of the world (the world's and its splits') is registered here. When the
// completion poller aborts a communicator for a failure of its own (deadline, NCCL
// asynchronous error, CUDA error) it reports the cause, which aborts the job as this rank; when
// the job aborts (here, on another group, or on another rank through the domain's transport),
// every live communicator is aborted (ncclCommAbort), so no kernel waits for a peer that will
// never come, and the poller fails their Works with the cause at its next pass.
//
//   auto hub = CommAbortHub::Create(bootstrap.shared_abort_domain(), rank, /*report=*/true);
//   hub->Register(comm);                 // each communicator, at group creation
//   poller->SetFailureHandler([hub](const absl::Status& s) { hub->ReportFailure(s); });
//
// The domain's listener aborts communicators under the domain's lock: an abort waits for a
// call in progress on that communicator (see nccl_comm.h), so a blocking communicator stuck
// inside NCCL delays it; nonblocking communicators (BRAID_NCCL_BLOCKING=0) never do.
#ifndef BRAID_BACKENDS_NCCL_ABORT_HUB_H_
#define BRAID_BACKENDS_NCCL_ABORT_HUB_H_

#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "backends/nccl/nccl_comm.h"
#include "comm/abort_domain.h"

namespace braid::nccl {

class CommAbortHub {
 public:
  // `domain`: the job's (null: a domain of this rank alone). `report`: a communicator's own
  // failure aborts the job (BRAID_ABORT_ON_FAILURE).
  static std::shared_ptr<CommAbortHub> Create(std::shared_ptr<AbortDomain> domain, int world_rank,
                                              bool report);
  CommAbortHub(const CommAbortHub&) = delete;
  CommAbortHub& operator=(const CommAbortHub&) = delete;

  void Register(const std::shared_ptr<NcclComm>& comm);
  // A communicator of this world failed by itself: abort the job (if `report`).
  void ReportFailure(const absl::Status& cause);

  const std::shared_ptr<AbortDomain>& domain() const { return domain_; }
  int world_rank() const { return world_rank_; }

 private:
  CommAbortHub(std::shared_ptr<AbortDomain> domain, int world_rank, bool report)
      : domain_(std::move(domain)), world_rank_(world_rank), report_(report) {}
  void AbortAll(const absl::Status& cause);

  const std::shared_ptr<AbortDomain> domain_;
  const int world_rank_;
  const bool report_;
  std::mutex mu_;
  std::vector<std::weak_ptr<NcclComm>> comms_;  // guarded by mu_
  AbortDomain::Subscription sub_;               // last: unsubscribed first
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_ABORT_HUB_H_
