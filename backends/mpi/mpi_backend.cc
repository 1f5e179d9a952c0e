#include "backends/mpi/mpi_backend.h"

#include "absl/strings/str_cat.h"
#include "backends/mpi/group_setup.h"
#include "comm/status_macros.h"

namespace braid::mpi {

absl::StatusOr<std::unique_ptr<Backend>> MpiBackend::Create(const Options& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<MpiRuntime> runtime, MpiRuntime::Acquire());
  MpiGroup::Config config;
  config.timeout = options.timeout;
  config.spin = options.spin;
  config.validate = options.validate_collectives;
  return std::unique_ptr<Backend>(new MpiBackend(std::move(runtime), config));
}

absl::StatusOr<std::unique_ptr<Group>> MpiBackend::WorldGroup(int rank) {
  if (rank != runtime_->world_rank()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mpi backend: this process is world rank ", runtime_->world_rank(),
        "; it cannot create the world group of rank ", rank, " (see local_ranks())"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (world_handed_out_) {
      return absl::FailedPreconditionError(
          absl::StrCat("mpi backend: the world group of rank ", rank, " was already created"));
    }
    world_handed_out_ = true;
  }
  ASSIGN_OR_RETURN(MpiComm data, DupComm(runtime_, MPI_COMM_WORLD,
                                         WorkInfo{"world", "create", 0, ""}, config_.timeout));
  return MpiGroup::Create(runtime_, std::move(data), "world", config_);
}

namespace {
const BackendRegistration kRegistration(
    "mpi", "OpenMPI: one process per rank, CPU buffers, nonblocking collectives",
    &MpiBackend::Create);
}  // namespace

}  // namespace braid::mpi
