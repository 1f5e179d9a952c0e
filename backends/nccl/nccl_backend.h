// The `nccl` backend: NCCL 2.28 collectives on CUDA device buffers, one rank per process and
// GPU, stream-ordered, with device readiness/completion events and host futures.
//
// README
// ------
// Layers of this folder (each uses only the ones above it):
//   cuda_api.h, nccl_api.h   the only places that call libcudart / libnccl (thin interfaces;
//                            tests swap in fakes: tests/nccl/fake_cuda_api.h, fake_nccl_api.h)
//   nccl_library.h           libnccl opened with dlopen at first use (BRAID_NCCL_LIBRARY);
//                            nothing links NCCL, and the CUDA runtime is linked statically, so
//                            every binary loads on machines without either
//   errors.h                 CUDA / NCCL results -> absl::Status, once
//   nccl_types.h             DType / ReduceOp -> NCCL types, FSDP2's avg and pre-mul-sum choices
//   cuda_handles.h           RAII streams, events, device and pinned buffers
//   poll.h                   the one deadline-bounded polling loop
//   nccl_comm.h              RAII communicator: init, split, blocking / nonblocking state
//                            machine, finalize, abort; RAII pre-mul-sum op
//   unique_id.h              the unique id as bytes; broadcast over a CPU group
//   completion_poller.h      progress thread: events + async errors -> host futures, deadlines
//   kernel_api.h             our bucket kernels behind a thin interface (fake: the CPU reference)
//   nccl_buffer_ops.h        BufferOps on the comm stream: memset, memcpy, cast kernel, events
//   nccl_group.h             Group: comm stream, readiness waits, coalesced buckets, split
//   nccl_backend.h           this file: worlds, the "nccl" registration
//   kernels/                 CUDA pack/unpack (scale fused) and cast kernels for buckets
//
// Two ways to make a world:
//   (a) the caller distributes the unique id (its own store, or bytes through the C API):
//         ASSIGN_OR_RETURN(std::string id, NewUniqueIdBytes(*RealNcclApi()));   // on rank 0
//         ASSIGN_OR_RETURN(auto b, NcclBackend::CreateFromUniqueId(RealApis(), id, world_size,
//                                                                   rank, config));
//         ASSIGN_OR_RETURN(std::unique_ptr<Group> world, b->WorldGroup(rank));
//   (b) launched by mpirun: BRAID_BACKEND=nccl, and CreateBackend(options) initializes MPI
//       (the `mpi` backend), broadcasts the id over MPI_COMM_WORLD, picks the device
//       (BRAID_CUDA_DEVICE, else the node-local rank (OMPI_COMM_WORLD_LOCAL_RANK) modulo the
//       device count) and the mode
//       (BRAID_NCCL_BLOCKING). The MPI world stays up for the backend's lifetime.
//   (c) launched by torchrun or srun (no OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK; RANK /
//       WORLD_SIZE or SLURM_PROCID / SLURM_NTASKS, with MASTER_ADDR / MASTER_PORT: see
//       backends/rendezvous/launcher_env.h) into a world of more than one rank:
//       CreateBackend(options) joins the rendezvous at rank 0's TCP store
//       (backends/rendezvous/launcher_rendezvous.h; a rank that never arrives fails everyone
//       at BRAID_TIMEOUT_MS naming it), rank 0 makes the id and publishes it there, the others
//       wait for it (ExchangeUniqueId), and the device is BRAID_CUDA_DEVICE, else LOCAL_RANK
//       (SLURM_LOCALID) modulo the device count. No MPI is initialized. CreateFromLauncher does
//       the same from an explicit LauncherEnv. Rank 0's backend serves the store: it must
//       outlive the others' creation (it does: WorldGroup is collective).
//       options.rendezvous (the embedder's rank, world size and store-address exchange, e.g.
//       torch.distributed's) takes the place of the launcher's variables, also under mpirun.
//   (d) no launcher at all: CreateBackend(options) makes a world of one rank on
//       BRAID_CUDA_DEVICE (else device 0) from an id it makes itself, without initializing MPI
//       (single-GPU runs). A launcher environment that does not parse (RANK >= WORLD_SIZE, a
//       missing MASTER_PORT, ...) is an error naming the variable, never a silent world of one.
//
// Semantics differ from the CPU backends in documented places, all NCCL's arithmetic
// (NCCL 2.28.9, src/enqueue.cc hostToDevRedOp and src/device/reduce_kernel.h): avg is ncclAvg,
// for floating types a sum pre-multiplied by 1/n, with 1/n computed as the double 1.0/n and
// converted to the data type through float (f32: float(1.0/n); bf16/f16: that float rounded to
// nearest even), each input multiplied by it in the data type, so rounding differs from
// sum-then-divide (integer avg would be a sum then a truncating division; Braid refuses it);
// premul_sum on bf16/f16 uses the scalar rounded to bf16/f16 (NCCL takes it in the data type);
// and bf16/f16 sums round to the data type after every addition (f16/bf16 __hadd), not once.
// Nothing blocks without a deadline except what NCCL itself may do inside a blocking
// communicator's call (see nccl_comm.h); prefer BRAID_NCCL_BLOCKING=0 where that matters.
//
// Without a GPU (CUDA error 35 or 100) creating the backend fails with FailedPrecondition
// naming the CUDA error; tests that need a device skip on it.
//
// Known hazards, not yet handled (from a review against NCCL's and CUDA's rules; none has run
// on a GPU yet):
//   - One completion poller thread per backend serves every group. It aborts communicators on
//     deadlines and, in hybrid mode, the reducer issues the replica all-reduce from a poller
//     callback: a blocking communicator stuck inside NCCL (or a nonblocking one waiting in
//     ReadyLocked) stalls every group's completions until its own deadline. A launcher thread
//     for collectives issued from callbacks, and aborts off the poller, would remove that.
//   - Collectives on different communicators (shard, replica, the optimizer's stats group, the
//     gatherer) are issued from different threads, so their order can differ across ranks;
//     NCCL asks for a consistent order across communicators (concurrent NCCL kernels are not
//     guaranteed to be co-resident). Issuing from one thread in bucket order would.
//   - Communicators are destroyed when their last reference drops, in an order that may differ
//     across ranks; recent NCCL versions synchronize ranks of a node in destroy.
//   - A null readiness event at MarkReady is trusted (documented in gradient_reducer.h and
//     braid.h): the comm stream does not order after the framework's compute stream by itself.
//     Refusing it on device would need the fake-device negative controls (which pass no events
//     on purpose to show stale results) to use a misplaced event instead.
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
  absl::StatusOr<std::unique_ptr<Group>> WorldGroup(int rank) override;

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
