// NcclComm: one owned NCCL communicator, its blocking/nonblocking state machine, and its end
// (orderly finalize, or abort).
//
//   NcclComm::Config cfg{/*name=*/"world", /*blocking=*/false, /*device=*/0};
//   ASSIGN_OR_RETURN(std::shared_ptr<NcclComm> world,
//                    NcclComm::Init(apis, id, nranks, rank, cfg, absl::Now() + timeout));
//   {
//     std::unique_lock<std::mutex> lock = world->Lock();
//     RETURN_IF_ERROR(world->ReadyLocked(deadline));               // never call while in progress
//     RETURN_IF_ERROR(world->AfterCallLocked(nccl.AllReduce(...), "ncclAllReduce", deadline));
//   }
//   ASSIGN_OR_RETURN(std::shared_ptr<NcclComm> shard, world->Split(color, key, child_cfg, dl));
//
// Nonblocking communicators: after a call returns ncclInProgress, AfterCallLocked records it and
// ReadyLocked polls it away (against a deadline) before the next call; Init and Split return
// only once the new communicator is ready. Children take the parent's mode.
// Ending: the destructor finalizes a healthy communicator (polled under the timeout) and aborts
// one whose finalize failed; Abort(cause) is idempotent and thread-safe, and afterwards every
// call returns the cause. Hold it in a shared_ptr: in-flight work keeps it alive.
// Threads: calls happen under Lock(); ProbeAsyncError() needs no lock. Abort waits for a call
// in progress, which a blocking communicator may never return from: use nonblocking mode where
// a hung peer must never hang the process. Details: docs/design/backends.md, "The nccl backend".
#ifndef BRAID_BACKENDS_NCCL_NCCL_COMM_H_
#define BRAID_BACKENDS_NCCL_NCCL_COMM_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/nccl/nccl_api.h"
#include "backends/nccl/nccl_types.h"
#include "comm/dtype.h"

namespace braid::nccl {

class NcclComm : public std::enable_shared_from_this<NcclComm> {
 public:
  struct Config {
    std::string name;  // group name: in errors, and NCCL's commName
    bool blocking = true;
    int device = 0;                               // CUDA device of this rank
    absl::Duration timeout = absl::Seconds(300);  // for the destructor's finalize
  };

  // ncclCommInitRankConfig; returns once the communicator is ready (nonblocking: polled).
  static absl::StatusOr<std::shared_ptr<NcclComm>> Init(NcclApis apis, const ncclUniqueId& id,
                                                        int nranks, int rank, Config config,
                                                        absl::Time deadline);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // ncclCommSplit (collective over this communicator). `color` < 0 means "no new
  // communicator" (NCCL_SPLIT_NOCOLOR) and returns null. Children take this one's mode.
  absl::StatusOr<std::shared_ptr<NcclComm>> Split(int color, int key, Config child,
                                                  absl::Time deadline);

  // Orderly end: finalize (polled), then destroy. On error or deadline: abort. Idempotent.
  absl::Status Finalize(absl::Time deadline);
  // ncclCommAbort; records `cause` as the failure every later call returns. Idempotent.
  void Abort(const absl::Status& cause);

  std::unique_lock<std::mutex> Lock() { return std::unique_lock<std::mutex>(mu_); }
  // Under Lock(): OK when a call may be issued now; polls ncclInProgress away first. Fails with
  // the failure once aborted, DeadlineExceeded (naming the communicator) when still in progress
  // at `deadline`, or NCCL's asynchronous error.
  absl::Status ReadyLocked(absl::Time deadline);
  // Under Lock(): classifies the result of a call just made on this communicator.
  // ncclInProgress on a nonblocking communicator is OK (the state is remembered); an error is
  // converted naming `call` and NCCL's last error.
  absl::Status AfterCallLocked(ncclResult_t rc, absl::string_view call);

  // Without the lock: OK while healthy (ncclSuccess or ncclInProgress), else the error. Used by
  // the poller between checks of the events.
  absl::Status ProbeAsyncError();

  ncclComm_t handle() const { return handle_; }  // valid while !failed()
  const Config& config() const { return config_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  NcclApi& nccl() const { return *apis_.nccl; }
  const NcclApis& apis() const { return apis_; }
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  absl::Status failure() const;

 private:
  enum class State { kLive, kFinalized, kAborted };

  NcclComm(NcclApis apis, ncclComm_t handle, Config config, bool in_progress);
  absl::Status ReadRankAndSize();
  void AbortLocked(const absl::Status& cause);
  absl::Status FinalizeLocked(absl::Time deadline);

  const NcclApis apis_;
  const Config config_;
  mutable std::mutex mu_;
  ncclComm_t handle_ = nullptr;  // guarded by mu_; null once finalized or aborted
  State state_ = State::kLive;   // guarded by mu_
  bool in_progress_ = false;     // guarded by mu_: the last call returned ncclInProgress
  absl::Status failure_;         // guarded by mu_
  std::atomic<bool> failed_{false};
  int rank_ = 0;
  int size_ = 0;
};

// A pre-multiplied-sum reduction op on one communicator, destroyed (ncclRedOpDestroy) by its
// destructor; create it right before the calls that use it and let it go right after they
// returned (NCCL allows destroying it then, while the collective still runs).
class PreMulSumOp {
 public:
  // Under comm.Lock(), with the communicator ready. The scalar is host-immediate.
  static absl::StatusOr<PreMulSumOp> CreateLocked(NcclComm& comm, double scalar, DType dtype,
                                                  absl::Time deadline);
  PreMulSumOp(PreMulSumOp&& o) noexcept;
  PreMulSumOp& operator=(PreMulSumOp&&) = delete;
  PreMulSumOp(const PreMulSumOp&) = delete;
  // Must run under the communicator's lock (the owning scope holds it).
  ~PreMulSumOp();
  ncclRedOp_t op() const { return op_; }

 private:
  PreMulSumOp(NcclComm* comm, ncclRedOp_t op, absl::Time deadline)
      : comm_(comm), op_(op), deadline_(deadline) {}
  NcclComm* comm_;
  ncclRedOp_t op_;
  absl::Time deadline_;
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_NCCL_COMM_H_
