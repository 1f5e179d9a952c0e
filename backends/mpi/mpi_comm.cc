#include "backends/mpi/mpi_comm.h"

#include <utility>

#include "backends/mpi/mpi_errors.h"
#include "comm/logging.h"

namespace braid::mpi {

absl::StatusOr<MpiComm> MpiComm::Adopt(std::shared_ptr<MpiRuntime> runtime, MPI_Comm comm) {
  MpiComm owned;
  owned.runtime_ = std::move(runtime);
  owned.comm_ = comm;
  std::lock_guard<std::mutex> lock(owned.runtime_->mu());
  RETURN_IF_MPI_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  RETURN_IF_MPI_ERROR(MPI_Comm_rank(comm, &owned.rank_));
  RETURN_IF_MPI_ERROR(MPI_Comm_size(comm, &owned.size_));
  return owned;
}

MpiComm::MpiComm(MpiComm&& other) noexcept
    : runtime_(std::move(other.runtime_)),
      comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(other.rank_),
      size_(other.size_) {}

MpiComm& MpiComm::operator=(MpiComm&& other) noexcept {
  if (this != &other) {
    Reset();
    runtime_ = std::move(other.runtime_);
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = other.rank_;
    size_ = other.size_;
  }
  return *this;
}

MPI_Comm MpiComm::Release() {
  runtime_.reset();
  return std::exchange(comm_, MPI_COMM_NULL);
}

void MpiComm::Reset() {
  if (comm_ != MPI_COMM_NULL && runtime_ != nullptr) {
    std::lock_guard<std::mutex> lock(runtime_->mu());
    const absl::Status s = MpiStatus(MPI_Comm_free(&comm_), "MPI_Comm_free");
    if (!s.ok()) Log().warn("mpi backend: {}", s.ToString());
  }
  comm_ = MPI_COMM_NULL;
  runtime_.reset();
}

}  // namespace braid::mpi
