// The world a non-MPI launcher describes in the environment: torchrun (and anything following
// its convention: torch.distributed.run, torchx, Kubernetes' PyTorchJob) or SLURM's srun.
//
//   ASSIGN_OR_RETURN(std::optional<LauncherEnv> env, LauncherEnvFromEnv());
//   if (env) { ... env->rank, env->world_size, env->master_addr:env->master_port ... }
//
// Which variables (read once here; no getenv elsewhere):
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK (optional, default RANK), MASTER_ADDR, MASTER_PORT
//   srun      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (optional, default SLURM_PROCID),
//             and the master from MASTER_ADDR, MASTER_PORT (srun sets no master address: the
//             batch script exports them, e.g. the first host of SLURM_JOB_NODELIST)
// torchrun's agent may serve its own (c10d) store at MASTER_PORT: when it says so
// (TORCHELASTIC_USE_AGENT_STORE=True) Braid's store takes MASTER_PORT + 1 instead, on
// MASTER_ADDR (that port must be free there; a taken one fails rank 0 naming the address).
// torchrun wins when both are present (torchrun started by srun, one agent per node, sets
// RANK per worker; SLURM_PROCID there numbers the agents). Neither present: std::nullopt.
//
// Errors (InvalidArgument), each naming the variables: half of a launcher's pair present
// (RANK without WORLD_SIZE), a missing MASTER_ADDR / MASTER_PORT, a non-numeric or negative
// value, a port outside 1..65535, RANK >= WORLD_SIZE, LOCAL_RANK >= WORLD_SIZE.
//
// mpirun is not described here: an MPI launcher may run inside a SLURM allocation (SLURM_*
// set in every process, SLURM_PROCID 0 everywhere), so callers check for MPI first
// (LaunchedByMpi).
#ifndef BRAID_BACKENDS_RENDEZVOUS_LAUNCHER_ENV_H_
#define BRAID_BACKENDS_RENDEZVOUS_LAUNCHER_ENV_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::rendezvous {

struct LauncherEnv {
  std::string launcher;     // "torchrun" or "srun"
  std::string master_addr;  // where rank 0 serves the rendezvous store
  int master_port = 0;      // the store's port: MASTER_PORT, or MASTER_PORT + 1 (agent_store)
  bool agent_store = false; // torchrun's agent holds MASTER_PORT
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;       // rank among this node's processes: picks the GPU
  std::string Describe() const;  // "torchrun rank 1 of 4 (local 1), master 10.0.0.1:29500"
};

// Parses the launcher variables from `vars` (name -> value).
absl::StatusOr<std::optional<LauncherEnv>> LauncherEnvFromMap(
    const std::map<std::string, std::string>& vars);
// LauncherEnvFromMap over the process environment's launcher variables.
absl::StatusOr<std::optional<LauncherEnv>> LauncherEnvFromEnv();
// Whether an MPI launcher (Open MPI's mpirun, a PMI / PMIx one) started this process, from
// `vars` / the process environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK).
bool LaunchedByMpi(const std::map<std::string, std::string>& vars);
bool LaunchedByMpi();

}  // namespace braid::rendezvous

#endif  // BRAID_BACKENDS_RENDEZVOUS_LAUNCHER_ENV_H_
