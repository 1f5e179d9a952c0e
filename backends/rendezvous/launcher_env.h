// The world a non-MPI launcher describes in the environment: torchrun (and anything following
// its convention: torch.distributed.run, torchx, Kubernetes' PyTorchJob) or SLURM's srun; or
// the same facts given by the embedder (Options::rendezvous, e.g. torch.distributed's).
//
//   ASSIGN_OR_RETURN(std::optional<LauncherEnv> env, LauncherEnvFor(options));
//   if (env) { ... env->rank, env->world_size, env->master_addr ... }
//
// Which variables (read once here; no getenv elsewhere):
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK (optional, default RANK), MASTER_ADDR, MASTER_PORT
//   srun      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (optional, default SLURM_PROCID),
//             and the master from MASTER_ADDR, MASTER_PORT (srun sets no master address: the
//             batch script exports them, e.g. the first host of SLURM_JOB_NODELIST)
// Ports (launcher_rendezvous.h has the whole story): rank 0's store listens on store_port
// (BRAID_STORE_PORT), by default 0, a port the OS picks; the other ranks learn that address
// from the embedder's exchange, else from a bootstrap store rank 0 serves at MASTER_ADDR:
// master_port only while the world is created. master_port is MASTER_PORT, or MASTER_PORT + 1
// when torchrun's agent serves its own (c10d) store at MASTER_PORT
// (TORCHELASTIC_USE_AGENT_STORE=True; that port must then be free on MASTER_ADDR).
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
#include "comm/options.h"
#include "comm/rendezvous_spec.h"

namespace braid::rendezvous {

struct LauncherEnv {
  std::string launcher;      // "torchrun", "srun", or "explicit" (Options::rendezvous)
  std::string master_addr;   // rank 0's host: its store listens there
  int master_port = 0;       // bootstrap port: MASTER_PORT, or MASTER_PORT + 1 (agent_store);
                             // 0: none (an explicit rendezvous without a launcher)
  bool agent_store = false;  // torchrun's agent holds MASTER_PORT
  int store_port = 0;        // BRAID_STORE_PORT: the store's own port; 0: the OS picks one
  AddressExchange exchange;  // the embedder's channel for the store's address (may be empty)
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among this node's processes: picks the GPU
  // "torchrun rank 1 of 4 (local 1), master 10.0.0.1:29500"
  std::string Describe() const;
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

// The world a backend meeting at a store should join: options.rendezvous when set (with
// master_addr, master_port and local_rank taken from the launcher's environment where it
// gives them), else LauncherEnvFromMap(vars); store_port from options either way.
// InvalidArgument when the explicit rendezvous disagrees with the launcher's RANK /
// WORLD_SIZE (naming both), has no master address, or has neither an exchange, a store_port
// nor a MASTER_PORT to meet at (world_size > 1). With a rendezvous, WORLD_SIZE (SLURM_NTASKS)
// set without RANK (SLURM_PROCID) -- torch.distributed's own multi-process tests export it
// alone -- must equal its world_size and is not taken as a launcher.
absl::StatusOr<std::optional<LauncherEnv>> LauncherEnvFor(
    const Options& options, const std::map<std::string, std::string>& vars);
// LauncherEnvFor over the process environment's launcher variables.
absl::StatusOr<std::optional<LauncherEnv>> LauncherEnvFor(const Options& options);

}  // namespace braid::rendezvous

#endif  // BRAID_BACKENDS_RENDEZVOUS_LAUNCHER_ENV_H_
