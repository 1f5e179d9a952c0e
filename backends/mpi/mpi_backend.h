// The `mpi` backend: OpenMPI, CPU buffers, one process per rank (many processes, many hosts).
//
//   // mpirun -np 4 ./trainer        (BRAID_BACKEND=mpi)
//   ASSIGN_OR_RETURN(Options o, Options::FromEnv());
//   ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, CreateBackend(o));
//   const int rank = backend->local_ranks()[0];          // this process's world rank
//   ASSIGN_OR_RETURN(std::unique_ptr<Group> world, backend->WorldGroup(rank));
//
// Creating the backend initializes MPI (or joins the host's MPI); the world group runs on a
// private duplicate of MPI_COMM_WORLD. MPI errors become statuses: the failed collective's
// Work names the op and MPI's error, and its group fails. That holds fully when the backend
// initializes MPI (it sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and MPI_COMM_SELF). A host
// application that initialized MPI itself must have asked for MPI_THREAD_MULTIPLE, and keeps
// its error handlers: under MPI's default MPI_ERRORS_ARE_FATAL, an error raised while a
// request completes (a truncated message when ranks' counts differ, say) aborts the job unless
// the host sets MPI_ERRORS_RETURN on MPI_COMM_WORLD (see mpi_errors.h, mpi_runtime.h). Groups
// keep MPI alive: they may outlive the backend, and MPI is finalized (when the backend
// initialized it) when the last of them goes. avg, premul_sum and bf16/f16 are emulated (f32
// staging and host scaling passes, see reduce_plan.h), so results match the other backends'
// semantics exactly but the reduction order is MPI's.
// Engines (BRAID_MPI_ENGINE, comm_thread.h): under MPI_THREAD_MULTIPLE each group has a
// communication thread running its larger collectives as blocking MPI calls (Open MPI's tuned
// algorithms, 2-4x faster than its nonblocking ones from 1 MiB up here); small ones go to the
// nonblocking progress engine, whose waiter drives MPI itself (progress_engine.h).
#ifndef BRAID_BACKENDS_MPI_MPI_BACKEND_H_
#define BRAID_BACKENDS_MPI_MPI_BACKEND_H_

#include <memory>
#include <mutex>
#include <vector>

#include "backends/mpi/mpi_group.h"
#include "backends/mpi/mpi_runtime.h"
#include "comm/backend.h"

namespace braid::mpi {

class MpiBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const Options& options);

  absl::string_view name() const override { return "mpi"; }
  Capabilities capabilities() const override { return MpiGroup::MpiCapabilities(); }
  int world_size() const override { return runtime_->world_size(); }
  std::vector<int> local_ranks() const override { return {runtime_->world_rank()}; }
  // Collective over MPI_COMM_WORLD (a nonblocking dup under the deadline); once.
  absl::StatusOr<std::unique_ptr<Group>> CreateWorldGroup(int rank) override;

 private:
  MpiBackend(std::shared_ptr<MpiRuntime> runtime, const MpiGroup::Config& config)
      : runtime_(std::move(runtime)), config_(config) {}

  const std::shared_ptr<MpiRuntime> runtime_;
  const MpiGroup::Config config_;
  std::mutex mu_;
  bool world_handed_out_ = false;  // guarded by mu_
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_MPI_BACKEND_H_
