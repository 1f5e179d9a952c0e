#include "backends/nccl/nccl_comm.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/nccl/errors.h"
#include "backends/nccl/poll.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::nccl {
namespace {

ncclConfig_t MakeConfig(const NcclComm::Config& c) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = c.blocking ? 1 : 0;
  cfg.commName = c.name.c_str();
  return cfg;
}

}  // namespace

NcclComm::NcclComm(NcclApis apis, ncclComm_t handle, Config config, bool in_progress)
    : apis_(std::move(apis)),
      config_(std::move(config)),
      handle_(handle),
      in_progress_(in_progress) {}

absl::StatusOr<std::shared_ptr<NcclComm>> NcclComm::Init(NcclApis apis, const ncclUniqueId& id,
                                                         int nranks, int rank, Config config,
                                                         absl::Time deadline) {
  const std::string what =
      absl::StrCat("creating the NCCL communicator of group '", config.name, "' (rank ", rank,
                   " of ", nranks, ", device ", config.device, ")");
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank out of range"));
  }
  RETURN_IF_ERROR(WithContext(
      CudaStatus(*apis.cuda, apis.cuda->SetDevice(config.device), "cudaSetDevice"), what));
  std::shared_ptr<NcclComm> comm(new NcclComm(apis, nullptr, std::move(config), false));
  std::unique_lock<std::mutex> lock = comm->Lock();
  ncclConfig_t cfg = MakeConfig(comm->config_);
  ncclComm_t handle = nullptr;
  const ncclResult_t rc = apis.nccl->CommInitRankConfig(&handle, nranks, id, rank, &cfg);
  comm->handle_ = handle;
  if (handle == nullptr && rc != ncclSuccess && rc != ncclInProgress) {
    comm->state_ = State::kAborted;
    comm->failed_ = true;
    return WithContext(NcclStatus(*apis.nccl, rc, "ncclCommInitRankConfig"), what);
  }
  absl::Status s = comm->AfterCallLocked(rc, "ncclCommInitRankConfig");
  if (s.ok() && !comm->config_.blocking) comm->in_progress_ = true;  // poll the init through
  if (s.ok()) s = comm->ReadyLocked(deadline);
  if (s.ok()) s = comm->ReadRankAndSize();
  if (s.ok() && (comm->rank_ != rank || comm->size_ != nranks)) {
    s = absl::InternalError(absl::StrCat("NCCL reports rank ", comm->rank_, " of ", comm->size_));
  }
  if (!s.ok()) {
    s = WithContext(s, what);
    comm->AbortLocked(s);
    return s;
  }
  return comm;
}

NcclComm::~NcclComm() {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ != State::kLive || handle_ == nullptr) return;  // never made (failed init/split)
  const absl::Status s = FinalizeLocked(absl::Now() + config_.timeout);
  if (!s.ok()) Log().error("nccl backend: {}", s.ToString());
}

absl::Status NcclComm::ReadRankAndSize() {
  RETURN_IF_ERROR(
      NcclStatus(*apis_.nccl, apis_.nccl->CommCount(handle_, &size_), "ncclCommCount", handle_));
  return NcclStatus(*apis_.nccl, apis_.nccl->CommUserRank(handle_, &rank_), "ncclCommUserRank",
                    handle_);
}

absl::Status NcclComm::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

absl::Status NcclComm::ReadyLocked(absl::Time deadline) {
  if (state_ != State::kLive) {
    if (!failure_.ok()) return failure_;
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL communicator of group '", config_.name, "' was finalized"));
  }
  if (!in_progress_) return absl::OkStatus();
  absl::Status s = PollUntil(deadline, [&]() -> std::optional<absl::Status> {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = apis_.nccl->CommGetAsyncError(handle_, &async);
    if (rc != ncclSuccess) return NcclStatus(*apis_.nccl, rc, "ncclCommGetAsyncError", handle_);
    if (async == ncclInProgress) return std::nullopt;
    return NcclStatus(*apis_.nccl, async, "asynchronous NCCL operation", handle_);
  });
  if (absl::IsDeadlineExceeded(s) && s.message().empty()) {
    s = absl::DeadlineExceededError(
        absl::StrCat("the NCCL communicator of group '", config_.name,
                     "' was still in progress (ncclInProgress) at the deadline"));
  }
  if (s.ok()) in_progress_ = false;
  return s;
}

absl::Status NcclComm::AfterCallLocked(ncclResult_t rc, absl::string_view call) {
  if (rc == ncclInProgress) {
    if (config_.blocking) {
      return absl::InternalError(
          absl::StrCat(call, " returned ncclInProgress on the blocking communicator of group '",
                       config_.name, "'"));
    }
    in_progress_ = true;
    return absl::OkStatus();
  }
  return NcclStatus(*apis_.nccl, rc, call, handle_);
}

absl::Status NcclComm::ProbeAsyncError() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return absl::OkStatus();  // a call or an abort is under way: next round
  if (state_ != State::kLive) return failure_;
  ncclResult_t async = ncclSuccess;
  const ncclResult_t rc = apis_.nccl->CommGetAsyncError(handle_, &async);
  if (rc != ncclSuccess) return NcclStatus(*apis_.nccl, rc, "ncclCommGetAsyncError", handle_);
  if (async == ncclSuccess || async == ncclInProgress) return absl::OkStatus();
  return NcclStatus(*apis_.nccl, async, "NCCL asynchronous error", handle_);
}

absl::StatusOr<std::shared_ptr<NcclComm>> NcclComm::Split(int color, int key, Config child_config,
                                                          absl::Time deadline) {
  const std::string what = absl::StrCat("ncclCommSplit of group '", config_.name, "' into '",
                                        child_config.name, "' (color ", color, ", key ", key, ")");
  child_config.blocking = config_.blocking;
  std::shared_ptr<NcclComm> child(new NcclComm(apis_, nullptr, std::move(child_config), false));
  std::unique_lock<std::mutex> lock(mu_);
  RETURN_IF_ERROR(WithContext(ReadyLocked(deadline), what));
  RETURN_IF_ERROR(WithContext(
      CudaStatus(*apis_.cuda, apis_.cuda->SetDevice(config_.device), "cudaSetDevice"), what));
  ncclConfig_t cfg = MakeConfig(child->config_);
  ncclComm_t handle = nullptr;
  absl::Status s = AfterCallLocked(
      apis_.nccl->CommSplit(handle_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &handle, &cfg),
      "ncclCommSplit");
  // The child pointer is valid only once the parent is back to ncclSuccess.
  if (s.ok()) s = ReadyLocked(deadline);
  if (!s.ok()) {
    // Peers may have split: this communicator's call order is no longer known to match.
    s = WithContext(s, what);
    // Parent first: aborting it joins a pending nonblocking split, which may write the child's
    // pointer into `handle` on its way out (also on failure); a child seen then is aborted
    // too. `handle` stays in this frame until that join is over.
    AbortLocked(s);
    if (ncclComm_t child_handle = __atomic_load_n(&handle, __ATOMIC_ACQUIRE);
        child_handle != nullptr) {
      apis_.nccl->CommAbort(child_handle);
    }
    return s;
  }
  if (handle == nullptr) {
    if (color < 0) return std::shared_ptr<NcclComm>();
    s = absl::InternalError(absl::StrCat(what, ": NCCL returned no communicator"));
    AbortLocked(s);
    return s;
  }
  lock.unlock();
  std::unique_lock<std::mutex> child_lock = child->Lock();
  child->handle_ = handle;
  child->in_progress_ = !child->config_.blocking;
  s = child->ReadyLocked(deadline);
  if (s.ok()) s = child->ReadRankAndSize();
  if (!s.ok()) {
    s = WithContext(s, what);
    child->AbortLocked(s);
    return s;
  }
  return child;
}

absl::Status NcclComm::Finalize(absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  return FinalizeLocked(deadline);
}

absl::Status NcclComm::FinalizeLocked(absl::Time deadline) {
  if (state_ == State::kFinalized) return absl::OkStatus();
  if (state_ == State::kAborted) return failure_;
  const std::string what =
      absl::StrCat("finalizing the NCCL communicator of group '", config_.name, "'");
  absl::Status s = ReadyLocked(deadline);
  if (s.ok()) s = AfterCallLocked(apis_.nccl->CommFinalize(handle_), "ncclCommFinalize");
  if (s.ok() && !config_.blocking) in_progress_ = true;  // finalize completes asynchronously
  if (s.ok()) s = ReadyLocked(deadline);
  if (!s.ok()) {
    s = WithContext(s, what);
    AbortLocked(s);  // frees what finalize could not
    return s;
  }
  s = NcclStatus(*apis_.nccl, apis_.nccl->CommDestroy(handle_), "ncclCommDestroy");
  handle_ = nullptr;
  state_ = State::kFinalized;
  failed_.store(true, std::memory_order_release);
  failure_ = absl::FailedPreconditionError(
      absl::StrCat("the NCCL communicator of group '", config_.name, "' was finalized"));
  return WithContext(s, what);
}

void NcclComm::Abort(const absl::Status& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  AbortLocked(cause);
}

void NcclComm::AbortLocked(const absl::Status& cause) {
  if (failure_.ok()) {
    failure_ = cause.ok() ? absl::AbortedError(absl::StrCat("the NCCL communicator of group '",
                                                            config_.name, "' was aborted"))
                          : cause;
  }
  failed_.store(true, std::memory_order_release);
  if (state_ != State::kLive) return;
  state_ = State::kAborted;
  if (handle_ == nullptr) return;
  const ncclResult_t rc = apis_.nccl->CommAbort(handle_);
  handle_ = nullptr;
  if (rc != ncclSuccess && rc != ncclInProgress) {
    Log().error("nccl backend: ncclCommAbort of group '{}' returned {} ({})", config_.name,
                static_cast<int>(rc), apis_.nccl->GetErrorString(rc));
  }
}

absl::StatusOr<PreMulSumOp> PreMulSumOp::CreateLocked(NcclComm& comm, double scalar, DType dtype,
                                                      absl::Time deadline) {
  ASSIGN_OR_RETURN(ScalarBytes bytes, EncodeScalar(scalar, dtype));
  RETURN_IF_ERROR(comm.ReadyLocked(deadline));
  ncclRedOp_t op = ncclSum;
  RETURN_IF_ERROR(comm.AfterCallLocked(
      comm.nccl().RedOpCreatePreMulSum(&op, bytes.bytes.data(), ToNcclType(dtype),
                                       ncclScalarHostImmediate, comm.handle()),
      "ncclRedOpCreatePreMulSum"));
  RETURN_IF_ERROR(comm.ReadyLocked(deadline));
  return PreMulSumOp(&comm, op, deadline);
}

PreMulSumOp::PreMulSumOp(PreMulSumOp&& o) noexcept
    : comm_(std::exchange(o.comm_, nullptr)), op_(o.op_), deadline_(o.deadline_) {}

PreMulSumOp::~PreMulSumOp() {
  if (comm_ == nullptr || comm_->failed()) return;  // an abort freed it with the communicator
  absl::Status s = comm_->ReadyLocked(deadline_);
  if (s.ok()) {
    s = comm_->AfterCallLocked(comm_->nccl().RedOpDestroy(op_, comm_->handle()),
                               "ncclRedOpDestroy");
  }
  if (!s.ok()) Log().error("nccl backend: {}", s.ToString());
}

}  // namespace braid::nccl
