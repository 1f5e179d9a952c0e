// The `gloo` backend: Gloo (Debian's libgloo, PyTorch's own CPU engine) over TCP, one rank per
// process, CPU buffers; for worlds launched by torchrun or srun, where there is no MPI.
//
//   ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, CreateBackend(options));   // options.backend
//   ASSIGN_OR_RETURN(std::unique_ptr<Group> world, b->WorldGroup(b->local_ranks().front()));
//
// Making a world: under torchrun / srun (or options.rendezvous, the embedder's) every rank
// joins the rendezvous at rank 0's TCP store (backends/rendezvous/), then WorldGroup connects
// Gloo's full mesh of pairs. No launcher: a world of one. Under mpirun: FailedPrecondition
// (use the `mpi` backend there).
//
// Semantics: every Braid dtype and reduce op (gloo_collectives.h), bit for bit with the serial
// reference where partial sums are exact (Gloo's ring adds in its own order). Every call has a
// deadline; Gloo's pairs are unusable after an error, so a failed call fails its group for
// good. Rank-order contract: comm/group.h. Lifetime: rank 0's backend serves the store; groups
// keep it alive. Files of this folder and details: docs/design/backends.md, "The gloo backend".
#ifndef BRAID_BACKENDS_GLOO_GLOO_BACKEND_H_
#define BRAID_BACKENDS_GLOO_GLOO_BACKEND_H_

#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/gloo/gloo_group.h"
#include "backends/rendezvous/launcher_env.h"
#include "comm/backend.h"
#include "comm/options.h"

namespace braid::gloo_backend {

struct GlooBackendConfig {
  absl::Duration timeout = absl::Seconds(300);   // BRAID_TIMEOUT_MS: every call's deadline
  absl::Duration spin = absl::Microseconds(20);  // BRAID_SPIN_US
  bool abort_on_failure = true;  // BRAID_ABORT_ON_FAILURE (comm/abort_domain.h, gloo_abort.h)
};

class GlooBackend final : public Backend {
 public:
  // The registry's factory (BRAID_BACKEND=gloo); see the header.
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const Options& options);
  // One rank of the world `env` describes (collective over its processes; rank 0 serves the
  // store). Errors: LauncherRendezvous::Join's (missing ranks named), then Gloo's device.
  static absl::StatusOr<std::unique_ptr<GlooBackend>> CreateFromLauncher(
      const rendezvous::LauncherEnv& env, const GlooBackendConfig& config);
  // A world of one, with its own store on 127.0.0.1.
  static absl::StatusOr<std::unique_ptr<GlooBackend>> CreateSingleRank(
      const GlooBackendConfig& config);

  absl::string_view name() const override { return "gloo"; }
  Capabilities capabilities() const override { return GlooGroup::GlooCapabilities(); }
  int world_size() const override { return world_size_; }
  std::vector<int> local_ranks() const override { return {rank_}; }
  // Connects the world's Gloo context (collective over the world); once.
  absl::StatusOr<std::unique_ptr<Group>> CreateWorldGroup(int rank) override;

 private:
  GlooBackend(std::shared_ptr<GlooWorld> world, int rank, int world_size)
      : world_(std::move(world)), rank_(rank), world_size_(world_size) {}

  const std::shared_ptr<GlooWorld> world_;
  const int rank_;
  const int world_size_;
  std::mutex mu_;
  bool world_handed_out_ = false;  // guarded by mu_
};

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_GLOO_BACKEND_H_
