// MpiComm: an owned MPI communicator, freed with MPI_Comm_free (under the MPI lock) when the
// owner goes away, always before MPI is finalized (it holds the runtime).
//
//   ASSIGN_OR_RETURN(MpiComm comm, MpiComm::Adopt(runtime, new_comm));  // errors now return
//   MPI_Iallreduce(..., comm.get(), &request);
//
// Adopt() switches the communicator to MPI_ERRORS_RETURN so MPI errors reach us as statuses
// instead of aborting the job. Free a communicator only once no request on it is in flight:
// the standard allows MPI_Comm_free under pending requests, but Open MPI 4.1's libnbc then
// progresses their schedules on the freed communicator and crashes (MpiGroup drains first;
// Release() is the way to leak one that still has live requests).
#ifndef BRAID_BACKENDS_MPI_MPI_COMM_H_
#define BRAID_BACKENDS_MPI_MPI_COMM_H_

#include <mpi.h>

#include <memory>

#include "absl/status/statusor.h"
#include "backends/mpi/mpi_runtime.h"

namespace braid::mpi {

class MpiComm {
 public:
  MpiComm() = default;
  // Takes ownership of `comm` (not MPI_COMM_NULL, not a predefined communicator). On error
  // the communicator is freed.
  static absl::StatusOr<MpiComm> Adopt(std::shared_ptr<MpiRuntime> runtime, MPI_Comm comm);
  ~MpiComm() { Reset(); }
  MpiComm(MpiComm&& other) noexcept;
  MpiComm& operator=(MpiComm&& other) noexcept;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  // Frees the communicator now.
  void Reset();
  // Gives up ownership: the caller frees the communicator (under the MPI lock).
  MPI_Comm Release();

 private:
  std::shared_ptr<MpiRuntime> runtime_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_MPI_COMM_H_
