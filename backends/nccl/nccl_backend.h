// The `nccl` backend: NCCL 2.28 collectives on CUDA device buffers, one rank per process and
// GPU, stream-ordered, with device readiness/completion events and host futures.
//
// README
// ------
// Layers of this folder (each uses only the ones above it):
//   cuda_api.h, nccl_api.h   the only places that call libcudart / libnccl (thin interfaces;
//                            tests swap in fakes: tests/nccl/fake_cuda_api.h, fake_nccl_api.h)
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
//       (BRAID_CUDA_DEVICE, else world rank modulo the device count) and the mode
//       (BRAID_NCCL_BLOCKING). The MPI world stays up for the backend's lifetime.
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
#include "comm/backend.h"

namespace braid::nccl {

struct NcclBackendConfig {
  bool blocking = true;  // NCCL communicator mode (BRAID_NCCL_BLOCKING)
  absl::Duration timeout = absl::Seconds(300);  // every call's default deadline
  absl::Duration spin = absl::Microseconds(20);
  int device = 0;  // this rank's CUDA device
};

// The real libraries.
NcclApis RealApis();

class NcclBackend final : public Backend {
 public:
  // The registry's factory (BRAID_BACKEND=nccl): the mpirun path, (b) above.
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const Options& options);
  // One rank of a world whose unique id (kUniqueIdBytes bytes) the caller distributed.
  static absl::StatusOr<std::unique_ptr<NcclBackend>> CreateFromUniqueId(
      NcclApis apis, absl::string_view unique_id, int world_size, int rank,
      const NcclBackendConfig& config);
  // One rank of a world over the ranks of `bootstrap` (a CPU group, same ranks): its rank 0
  // makes the id and broadcasts it (collective over `bootstrap`).
  static absl::StatusOr<std::unique_ptr<NcclBackend>> CreateWithBootstrap(
      NcclApis apis, Group& bootstrap, const NcclBackendConfig& config);
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
  std::mutex mu_;
  bool world_handed_out_ = false;  // guarded by mu_
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_NCCL_BACKEND_H_
