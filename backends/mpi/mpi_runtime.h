// MpiRuntime: MPI itself, initialized once per process and finalized when nothing uses it.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<MpiRuntime> rt, MpiRuntime::Acquire());
//   int rank = rt->world_rank();
//   std::lock_guard<std::mutex> lock(rt->mu());   // around every MPI call
//
// Acquire() calls MPI_Init_thread asking for MPI_THREAD_MULTIPLE and accepts
// MPI_THREAD_SERIALIZED or better (the backend serializes its MPI calls under mu() anyway).
// If the host application already initialized MPI, the runtime uses it and leaves finalizing
// to the host. Every group holds the runtime, so groups may outlive the Backend; the last
// holder stops the progress engine and calls MPI_Finalize, unless MPI still owns buffers of
// an operation that missed its deadline (then finalizing could hang: it is skipped and
// logged). Finalize runs on the thread that drops the last holder: MPI wants that to be the
// thread that initialized it, so destroy groups and the backend on the main thread.
//
// MPI is process state (MPI_Init may run once per process), so Acquire() hands every backend
// in the process the same live runtime: the one process-wide handle in the mpi backend, kept
// as a weak reference behind a lock.
#ifndef BRAID_BACKENDS_MPI_MPI_RUNTIME_H_
#define BRAID_BACKENDS_MPI_MPI_RUNTIME_H_

#include <memory>
#include <mutex>

#include "absl/status/statusor.h"
#include "backends/mpi/mpi_types.h"
#include "backends/mpi/progress_engine.h"

namespace braid::mpi {

class MpiRuntime {
 public:
  // The live runtime, initializing MPI if nobody has. FailedPrecondition when MPI was
  // already finalized, or initialized by the host below MPI_THREAD_SERIALIZED.
  static absl::StatusOr<std::shared_ptr<MpiRuntime>> Acquire();
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  ProgressEngine& engine() const { return *engine_; }
  const MpiOps& ops() const { return *ops_; }
  // The MPI lock (the engine's).
  std::mutex& mu() const { return engine_->mu(); }

 private:
  MpiRuntime(bool owns_mpi, int world_rank, int world_size, std::unique_ptr<MpiOps> ops);

  const bool owns_mpi_;  // we called MPI_Init_thread, so we finalize
  const int world_rank_;
  const int world_size_;
  std::unique_ptr<MpiOps> ops_;  // freed before MPI_Finalize
  std::shared_ptr<ProgressEngine> engine_;
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_MPI_RUNTIME_H_
