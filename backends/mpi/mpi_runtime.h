// MpiRuntime: MPI itself, initialized once per process and finalized when nothing uses it.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<MpiRuntime> rt, MpiRuntime::Acquire());
//   int rank = rt->world_rank();
//   std::lock_guard<std::mutex> lock(rt->mu());   // around every MPI call
//
// Who initializes MPI decides what the runtime accepts and what it changes:
//   - MPI not initialized yet: Acquire() calls MPI_Init_thread asking for MPI_THREAD_MULTIPLE
//     and accepts MPI_THREAD_SERIALIZED or better. Under SERIALIZED every MPI call of the
//     backend runs under mu(), which is only safe while the backend is the process's only MPI
//     user: an application that initializes MPI through Braid must not call MPI itself unless
//     it got MULTIPLE (thread_multiple()). It also sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and
//     MPI_COMM_SELF: Open MPI raises errors of completing requests (MPI_Testsome, e.g. the
//     truncation of a reduce-scatter whose counts differ between ranks) on MPI_COMM_WORLD's
//     handler, not on the request's communicator, and the default MPI_ERRORS_ARE_FATAL would
//     kill the job instead of failing the collective. The runtime finalizes MPI.
//   - The host application initialized MPI: it must have asked for MPI_THREAD_MULTIPLE
//     (anything less is FailedPrecondition naming the level it got), because the host's threads
//     call MPI without taking mu() while the progress thread does. The runtime leaves the
//     host's error handlers alone and never finalizes; see mpi_errors.h for what the host's
//     MPI_ERRORS_ARE_FATAL on MPI_COMM_WORLD means for Braid's errors.
// Every group holds the runtime, so groups may outlive the Backend; the last holder stops the
// progress engine and calls MPI_Finalize (when the runtime initialized MPI), unless MPI still
// owns buffers of an operation that missed its deadline (then finalizing could hang: it is
// skipped and logged). Finalize runs on the thread that drops the last holder: MPI wants that
// to be the thread that initialized it, so destroy groups and the backend on the main thread.
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
  // already finalized, when the host initialized it below MPI_THREAD_MULTIPLE, or when MPI
  // initialized here provides less than MPI_THREAD_SERIALIZED.
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
  // MPI provides MPI_THREAD_MULTIPLE: threads may call MPI at the same time, so a blocking
  // call that orders nothing against the engine (MPI_Comm_split) may run without mu().
  // False only when the runtime initialized MPI and got MPI_THREAD_SERIALIZED.
  bool thread_multiple() const { return thread_multiple_; }
  // The job's abort domain (comm/abort_domain.h): one per process, shared by every group.
  // Its side channel to the other processes is opened by the first world group
  // (MpiBackend::WorldGroup, a collective) and closed before MPI_Finalize.
  const std::shared_ptr<AbortDomain>& abort_domain() const { return abort_domain_; }

 private:
  MpiRuntime(std::shared_ptr<ProgressEngine> engine, bool owns_mpi, int thread_level,
             int world_rank, int world_size, std::unique_ptr<MpiOps> ops);

  const bool owns_mpi_;  // we called MPI_Init_thread, so we finalize
  const bool thread_multiple_;
  const int world_rank_;
  const int world_size_;
  std::unique_ptr<MpiOps> ops_;  // freed before MPI_Finalize
  std::shared_ptr<AbortDomain> abort_domain_;
  std::shared_ptr<ProgressEngine> engine_;
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_MPI_RUNTIME_H_
