#include "backends/mpi/collective_op.h"

#include <cstring>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/mpi/mpi_errors.h"
#include "backends/mpi/mpi_types.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"

namespace braid::mpi {
namespace {

bool Reduces(CollectiveKind k) {
  return k == CollectiveKind::kAllReduce || k == CollectiveKind::kReduceScatter;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CollectiveOp>> CollectiveOp::Create(Params params) {
  if (params.args.count > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::UnimplementedError(absl::StrCat(
        params.work->info().Describe(), ": count ", params.args.count,
        " exceeds MPI's int element count; the mpi backend does not split large calls"));
  }
  std::unique_ptr<CollectiveOp> op(new CollectiveOp(std::move(params)));
  RETURN_IF_ERROR(op->Prepare());
  return op;
}

CollectiveOp::CollectiveOp(Params p)
    : Operation(std::move(p.group), std::move(p.work), p.deadline, p.timeout),
      args_(std::move(p.args)),
      turn_(p.turn),
      world_rank_(p.world_rank),
      ops_(*p.ops) {}

absl::Status CollectiveOp::Prepare() {
  mpi_send_ = args_.in_place ? MPI_IN_PLACE : args_.send;
  mpi_recv_ = args_.recv;
  result_ = args_.recv;
  result_type_ = args_.dtype;
  plan_.wire = args_.dtype;
  if (!Reduces(args_.kind)) return absl::OkStatus();
  // A buffer as large as the caller's: its failure is the call's, never an exception.
  const auto stage = [this](size_t bytes) -> absl::Status {
    staging_.reset(new (std::nothrow) std::byte[bytes]);
    if (staging_ != nullptr || bytes == 0) return absl::OkStatus();
    return absl::ResourceExhaustedError(absl::StrCat(work()->info().Describe(), ": allocating ",
                                                     bytes, " bytes of host staging memory"));
  };
  const int n = group()->size;
  plan_ = PlanReduce(args_.dtype, args_.op, n, args_.options.half_wire);
  if (plan_.stage_input) {
    const size_t elems = args_.send_count(n);
    RETURN_IF_ERROR(stage(elems * DTypeSize(plan_.wire)));
    CastScale(args_.send, args_.dtype, staging_.get(), plan_.wire, elems, plan_.input_scale);
    if (plan_.narrow_output) {
      // Reduce in place in the staging buffer; a reduce-scatter leaves its block at the start.
      mpi_send_ = MPI_IN_PLACE;
      mpi_recv_ = staging_.get();
      result_ = staging_.get();
      result_type_ = plan_.wire;
    } else {
      mpi_send_ = staging_.get();
    }
  } else if (args_.kind == CollectiveKind::kReduceScatter && args_.in_place) {
    // recv lies inside send, which MPI forbids out of place; MPI_IN_PLACE would put the block
    // at the start of the caller's buffer. Receive into an owned block and copy it into place.
    RETURN_IF_ERROR(stage(args_.count * DTypeSize(args_.dtype)));
    mpi_send_ = args_.send;
    mpi_recv_ = staging_.get();
    result_ = staging_.get();
  }
  return absl::OkStatus();
}

absl::Status CollectiveOp::Start() {
  if (!group()->validate) {
    phase_ = Phase::kData;
    return IssueData();
  }
  mine_ = CollectiveRecord(args_, world_rank_);
  table_.assign(static_cast<size_t>(group()->size), CallRecord{});
  phase_ = Phase::kExchanging;
  RETURN_IF_MPI_ERROR(MPI_Iallgather(&mine_, CallRecord::kWords, MPI_INT64_T, table_.data(),
                                     CallRecord::kWords, MPI_INT64_T, group()->control,
                                     &request()));
  return absl::OkStatus();
}

absl::StatusOr<Operation::Progress> CollectiveOp::Advance() {
  switch (phase_) {
    case Phase::kExchanging:
      verdict_ = CheckSameCall(table_, work()->info().Describe());
      phase_ = Phase::kAwaitingTurn;
      [[fallthrough]];
    case Phase::kAwaitingTurn: {
      GroupState& g = *group();
      RETURN_IF_ERROR(g.CheckUsableLocked());  // destroyed or failed: the turn never comes
      if (g.next_data_turn != turn_) return Progress::kRunning;
      ++g.next_data_turn;
      RETURN_IF_ERROR(verdict_);
      phase_ = Phase::kData;
      absl::Status issued = IssueData();
      if (!issued.ok()) g.MarkFailedLocked(issued);
      RETURN_IF_ERROR(issued);
      return Progress::kRunning;
    }
    case Phase::kData:
      return Progress::kDone;
  }
  return Progress::kDone;
}

absl::Status CollectiveOp::IssueData() {
  RETURN_IF_ERROR(group()->CheckUsableLocked());
  const MPI_Comm comm = group()->data;
  const int count = static_cast<int>(args_.count);
  const MPI_Datatype type = MpiDatatype(plan_.wire);
  MPI_Request* req = &request();
  switch (args_.kind) {
    case CollectiveKind::kAllReduce:
      RETURN_IF_MPI_ERROR(MPI_Iallreduce(mpi_send_, mpi_recv_, count, type,
                                         ops_.For(plan_.mpi_op, plan_.wire), comm, req));
      break;
    case CollectiveKind::kReduceScatter:
      RETURN_IF_MPI_ERROR(MPI_Ireduce_scatter_block(mpi_send_, mpi_recv_, count, type,
                                                    ops_.For(plan_.mpi_op, plan_.wire), comm, req));
      break;
    case CollectiveKind::kAllGather:
      if (args_.in_place) {
        RETURN_IF_MPI_ERROR(
            MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, mpi_recv_, count, type, comm, req));
      } else {
        RETURN_IF_MPI_ERROR(
            MPI_Iallgather(mpi_send_, count, type, mpi_recv_, count, type, comm, req));
      }
      break;
    case CollectiveKind::kBroadcast:
      RETURN_IF_MPI_ERROR(MPI_Ibcast(mpi_recv_, count, type, args_.root, comm, req));
      break;
    case CollectiveKind::kBarrier:
      RETURN_IF_MPI_ERROR(MPI_Ibarrier(comm, req));
      break;
  }
  return absl::OkStatus();
}

absl::Status CollectiveOp::RunBlocking(MPI_Comm comm, bool* fails_group) {
  *fails_group = true;
  const std::string what = work()->info().Describe();
  if (group()->validate) {
    mine_ = CollectiveRecord(args_, world_rank_);
    table_.assign(static_cast<size_t>(group()->size), CallRecord{});
    RETURN_IF_ERROR(
        WithContext(MpiStatus(MPI_Allgather(&mine_, CallRecord::kWords, MPI_INT64_T, table_.data(),
                                            CallRecord::kWords, MPI_INT64_T, comm),
                              "MPI_Allgather (call records)"),
                    what));
    absl::Status same = CheckSameCall(table_, what);
    if (!same.ok()) {
      *fails_group = false;  // every rank holds the same table: all fail this call alike
      return same;
    }
  }
  const int count = static_cast<int>(args_.count);
  const MPI_Datatype type = MpiDatatype(plan_.wire);
  int rc = MPI_SUCCESS;
  const char* call = "";
  switch (args_.kind) {
    case CollectiveKind::kAllReduce:
      call = "MPI_Allreduce";
      rc = MPI_Allreduce(mpi_send_, mpi_recv_, count, type, ops_.For(plan_.mpi_op, plan_.wire),
                         comm);
      break;
    case CollectiveKind::kReduceScatter:
      call = "MPI_Reduce_scatter_block";
      rc = MPI_Reduce_scatter_block(mpi_send_, mpi_recv_, count, type,
                                    ops_.For(plan_.mpi_op, plan_.wire), comm);
      break;
    case CollectiveKind::kAllGather:
      call = "MPI_Allgather";
      rc = args_.in_place
               ? MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, mpi_recv_, count, type, comm)
               : MPI_Allgather(mpi_send_, count, type, mpi_recv_, count, type, comm);
      break;
    case CollectiveKind::kBroadcast:
      call = "MPI_Bcast";
      rc = MPI_Bcast(mpi_recv_, count, type, args_.root, comm);
      break;
    case CollectiveKind::kBarrier:
      call = "MPI_Barrier";
      rc = MPI_Barrier(comm);
      break;
  }
  return WithContext(MpiStatus(rc, call), what);
}

void CollectiveOp::Finish() {
  if (!Reduces(args_.kind)) return;
  const size_t count = args_.count;
  if (result_ != args_.recv) {
    if (IsFloating(args_.dtype)) {
      CastScale(result_, result_type_, args_.recv, args_.dtype, count,
                ScaleSpec{false, 1.0, plan_.divide_by});
    } else if (count > 0) {
      std::memcpy(args_.recv, result_, count * DTypeSize(args_.dtype));
    }
  } else if (plan_.divide_by > 0) {
    CastScale(args_.recv, args_.dtype, args_.recv, args_.dtype, count,
              ScaleSpec{false, 1.0, plan_.divide_by});
  }
}

}  // namespace braid::mpi
