// CollectiveOp: one Braid collective as MPI nonblocking calls.
//
//   CollectiveOp::Params p{state, work, deadline, timeout, args, turn, world_rank};
//   ASSIGN_OR_RETURN(std::unique_ptr<CollectiveOp> op, CollectiveOp::Create(std::move(p)));
//   RETURN_IF_ERROR(engine.Submit(std::move(op)));   // completes `work` when done
//
// Phases:
//   [validate] exchange CallRecords on the group's control communicator, then wait for this
//              collective's turn (see below);
//   data       MPI_Iallreduce / MPI_Ireduce_scatter_block / MPI_Iallgather / MPI_Ibcast /
//              MPI_Ibarrier on the data communicator, in-place forms with MPI_IN_PLACE;
//   finish     host-side step from the ReducePlan: narrow f32 staging into bf16/f16 (fusing
//              the avg divide), divide f32/f64 avg results, copy an in-place reduce-scatter
//              block into place.
// Blocking form (RunBlocking, on a group's comm thread): the same calls without the I, on the
// thread's own communicator, records exchanged just before on that communicator (no turns).
// Input staging (widening, premul scaling) happens in Create, on the caller's thread; the
// caller's send buffer is never modified. Staging buffers belong to the operation, so they
// live until MPI is done with them (see operation.h).
//
// RANK ORDER with validation: record exchanges are issued at launch, in call order, on the
// control communicator; exchanges complete in any order, so the data calls are issued by
// turn (GroupState::next_data_turn), which keeps the data communicator's call order equal to
// the launch order on every rank. A mismatch fails the collective on every rank (they all see
// the same records) and gives up its turn; the group stays usable.
#ifndef BRAID_BACKENDS_MPI_COLLECTIVE_OP_H_
#define BRAID_BACKENDS_MPI_COLLECTIVE_OP_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "backends/mpi/call_record.h"
#include "backends/mpi/mpi_types.h"
#include "backends/mpi/operation.h"
#include "backends/mpi/reduce_plan.h"
#include "comm/group.h"

namespace braid::mpi {

class CollectiveOp final : public Operation {
 public:
  struct Params {
    std::shared_ptr<GroupState> group;
    WorkPtr work;
    absl::Time deadline;
    absl::Duration timeout;
    CollectiveArgs args;  // validated by comm/group.cc (in_place detected there)
    uint64_t turn = 0;    // position among the group's collectives (used when validating)
    int world_rank = 0;
    const MpiOps* ops = nullptr;  // the runtime's; outlives every operation
  };

  // Unimplemented when the count does not fit MPI's int counts, before any buffer is read;
  // the caller then claims nothing for the call (no sequence number, no turn). Reads the send
  // buffer when the plan stages the input.
  static absl::StatusOr<std::unique_ptr<CollectiveOp>> Create(Params params);

  absl::Status Start() override;
  absl::StatusOr<Progress> Advance() override;
  void Finish() override;

  // The comm thread's path (comm_thread.h), instead of Start/Advance: with validation, the
  // record exchange (MPI_Allgather), then the data call, both blocking, on `comm`. Runs without
  // the MPI lock. On error, `*fails_group` says whether the group's call order is now unknown
  // (an MPI error: true) or every rank failed this call alike (a validation mismatch: false).
  // Finish() follows a success.
  absl::Status RunBlocking(MPI_Comm comm, bool* fails_group);

 private:
  enum class Phase { kExchanging, kAwaitingTurn, kData };

  CollectiveOp(Params params);
  // Plans the reduction and allocates the staging buffer it needs (ResourceExhausted naming
  // the call when the host cannot provide it).
  absl::Status Prepare();
  absl::Status IssueData();

  const CollectiveArgs args_;
  const uint64_t turn_;
  const int world_rank_;
  const MpiOps& ops_;
  Phase phase_ = Phase::kData;
  ReducePlan plan_;
  std::unique_ptr<std::byte[]> staging_;
  const void* mpi_send_ = nullptr;  // what MPI reads (MPI_IN_PLACE, the caller's, or staging)
  void* mpi_recv_ = nullptr;        // what MPI writes
  void* result_ = nullptr;          // where the result is when MPI is done
  DType result_type_ = DType::kF32;
  CallRecord mine_;
  std::vector<CallRecord> table_;
  absl::Status verdict_;  // the record comparison
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_COLLECTIVE_OP_H_
