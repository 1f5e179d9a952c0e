#include "backends/mpi/mpi_backend.h"

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "backends/mpi/group_setup.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::mpi {
namespace {

// Processes of this job on this node, as the launcher says (1 when it does not).
int LocalRanks() {
  for (const char* var :
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    int n = 0;
    if (const char* v = std::getenv(var); v != nullptr && absl::SimpleAtoi(v, &n) && n > 0)
      return n;
  }
  return 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MpiBackend::Create(const Options& options) {
  ASSIGN_OR_RETURN(std::shared_ptr<MpiRuntime> runtime, MpiRuntime::Acquire());
  MpiGroup::Config config;
  config.timeout = options.timeout;
  config.spin = options.spin;
  config.validate = options.validate_collectives;
  config.abort_on_failure = options.abort_on_failure;
  ASSIGN_OR_RETURN(MpiEngine engine, ParseMpiEngine(options.mpi_engine));
  const int local = LocalRanks();
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  config.engine = ResolveAuto(engine, local, cores);
  if (engine == MpiEngine::kAuto && config.engine == MpiEngine::kNonblocking) {
    Log().debug(
        "mpi backend: BRAID_MPI_ENGINE=auto -> nonblocking ({} ranks on {} cores: no spare core "
        "per rank for a comm thread; BRAID_MPI_ENGINE=sized forces the comm threads)",
        local, cores);
  }
  return std::unique_ptr<Backend>(new MpiBackend(std::move(runtime), config));
}

absl::StatusOr<std::unique_ptr<Group>> MpiBackend::CreateWorldGroup(int rank) {
  if (rank != runtime_->world_rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mpi backend: this process is world rank ", runtime_->world_rank(),
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
  if (!runtime_->engine().has_abort_channel()) {
    // The first world group of this process (every process makes one: collective) opens the
    // side channel on which the processes tell each other of a job abort.
    ASSIGN_OR_RETURN(MpiComm side,
                     DupComm(runtime_, MPI_COMM_WORLD, WorkInfo{"world", "abort channel", 0, ""},
                             config_.timeout));
    absl::StatusOr<std::unique_ptr<AbortChannel>> channel;
    {
      std::lock_guard<std::mutex> lock(runtime_->mu());
      channel = AbortChannel::Open(side.Release());
    }
    RETURN_IF_ERROR(channel.status());
    runtime_->engine().AttachAbortDomain(runtime_->abort_domain(), std::move(*channel),
                                         runtime_->world_rank(), config_.abort_on_failure);
  }
  return MpiGroup::Create(runtime_, std::move(data), "world", config_);
}

}  // namespace braid::mpi
