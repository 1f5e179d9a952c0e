// The `nccl` backend: NCCL 2.28 collectives on CUDA device buffers, one rank per process and
// GPU, stream-ordered, with device readiness/completion events and host futures. NCCL is
// opened with dlopen at first use and the CUDA runtime is linked statically, so every binary
// loads on machines without either; without a GPU (CUDA error 35 or 100) creating the backend
// fails with FailedPrecondition naming the error.
//
//   ASSIGN_OR_RETURN(std::string id, NewUniqueIdBytes(*RealNcclApi()));   // on rank 0, shared
//   ASSIGN_OR_RETURN(auto b, NcclBackend::CreateFromUniqueId(RealApis(), id, world_size,
//                                                             rank, config));
//   ASSIGN_OR_RETURN(std::unique_ptr<Group> world, b->WorldGroup(rank));
//
// CreateBackend(options) also makes a world by itself: under mpirun (the id broadcast over
// MPI), under torchrun / srun or options.rendezvous (the id through rank 0's TCP store), or a
// world of one without a launcher. A launcher environment that does not parse is an error
// naming the variable, never a silent world of one. The device is BRAID_CUDA_DEVICE, else the
// node-local rank modulo the device count.
//
// Contract: the rank-order contract of comm/group.h. Arithmetic is NCCL's, which differs from
// the CPU backends in documented places (avg as a pre-multiplied sum, bf16/f16 rounded after
// every addition). Nothing blocks without a deadline except what NCCL itself may do inside a
// blocking communicator's call; prefer BRAID_NCCL_BLOCKING=0 where that matters.
// The folder's layers, NCCL's arithmetic and the known hazards: docs/design/backends.md.
#ifndef BRAID_BACKENDS_NCCL_NCCL_BACKEND_H_
#define BRAID_BACKENDS_NCCL_NCCL_BACKEND_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "backends/nccl/nccl_api.h"
#include "backends/nccl/nccl_group.h"
#include "backends/rendezvous/launcher_env.h"
#include "backends/rendezvous/launcher_rendezvous.h"
#include "comm/backend.h"
#include "comm/options.h"

namespace braid::nccl {

struct NcclBackendConfig {
  bool blocking = true;                         // NCCL communicator mode (BRAID_NCCL_BLOCKING)
  absl::Duration timeout = absl::Seconds(300);  // every call's default deadline
  absl::Duration spin = absl::Microseconds(20);
  // This rank's CUDA device; -1: the rank modulo the number of visible devices.
  int device = 0;
  // The job's abort domain (comm/abort_domain.h, abort_hub.h); null: one of this rank alone
  // (CreateWithBootstrap uses the bootstrap group's, so a failure on either reaches the other
  // ranks through it). abort_on_failure: a communicator's own failure aborts the job.
  std::shared_ptr<AbortDomain> abort_domain;
  bool abort_on_failure = true;
};

// The backend's settings from BRAID_* options: BRAID_NCCL_BLOCKING, BRAID_CUDA_DEVICE,
// BRAID_TIMEOUT_MS, BRAID_SPIN_US.
NcclBackendConfig NcclConfigFromOptions(const Options& options);

// The real libraries: the CUDA runtime (linked statically) and NCCL, opened from
// `nccl_library` (BRAID_NCCL_LIBRARY) at its first use.
NcclApis RealApis(const std::string& nccl_library = "libnccl.so.2");

class NcclBackend final : public Backend {
 public:
  // The registry's factory (BRAID_BACKEND=nccl): the mpirun path (b), the torchrun / srun
  // path (c), or a world of one (d).
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const Options& options);
  // (c) above: a world of one rank (options: cuda_device, nccl_blocking, timeout, spin).
  static absl::StatusOr<std::unique_ptr<NcclBackend>> CreateSingleRank(NcclApis apis,
                                                                       const Options& options);
  // One rank of a world whose unique id (kUniqueIdBytes bytes) the caller distributed.
  // Errors, in this order: InvalidArgument (rank outside the world, timeout, id length);
  // FailedPrecondition when NCCL cannot be loaded (naming the library) or there is no usable
  // GPU (naming the CUDA error); InvalidArgument for a device that does not exist.
  static absl::StatusOr<std::unique_ptr<NcclBackend>> CreateFromUniqueId(
      NcclApis apis, absl::string_view unique_id, int world_size, int rank,
      const NcclBackendConfig& config);
  // One rank of a world over the ranks of `bootstrap` (a CPU group, same ranks): its rank 0
  // makes the id and broadcasts it (collective over `bootstrap`).
  static absl::StatusOr<std::unique_ptr<NcclBackend>> CreateWithBootstrap(
      NcclApis apis, Group& bootstrap, const NcclBackendConfig& config);
  // (c) above: one rank of the world `env` describes; its rank 0 serves the store. Collective
  // over the world's processes. Errors: those of LauncherRendezvous::Join (a missing rank
  // named), of ExchangeUniqueId, then of CreateFromUniqueId.
  static absl::StatusOr<std::unique_ptr<NcclBackend>> CreateFromLauncher(
      NcclApis apis, const rendezvous::LauncherEnv& env, const NcclBackendConfig& config);
  ~NcclBackend() override;

  absl::string_view name() const override { return "nccl"; }
  Capabilities capabilities() const override { return NcclGroup::NcclCapabilities(); }
  int world_size() const override { return world_size_; }
  std::vector<int> local_ranks() const override { return {rank_}; }
  // Collective over the world (ncclCommInitRankConfig); once. The group may outlive this.
  absl::StatusOr<std::unique_ptr<Group>> CreateWorldGroup(int rank) override;

 private:
  NcclBackend(std::shared_ptr<const NcclContext> ctx, const ncclUniqueId& id, int world_size,
              int rank)
      : ctx_(std::move(ctx)), id_(id), world_size_(world_size), rank_(rank) {}

  const std::shared_ptr<const NcclContext> ctx_;
  const ncclUniqueId id_;
  const int world_size_;
  const int rank_;
  // The mpirun path keeps the MPI world it bootstrapped from (MPI is finalized after it).
  std::unique_ptr<Group> bootstrap_group_;
  std::unique_ptr<Backend> bootstrap_backend_;
  // The torchrun / srun path keeps its rendezvous (on rank 0, the store's server).
  std::unique_ptr<rendezvous::LauncherRendezvous> rendezvous_;
  std::mutex mu_;
  bool world_handed_out_ = false;  // guarded by mu_
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_NCCL_BACKEND_H_
