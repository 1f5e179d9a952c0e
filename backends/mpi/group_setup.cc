#include "backends/mpi/group_setup.h"

#include <utility>

#include "backends/mpi/mpi_errors.h"
#include "backends/mpi/operation.h"

namespace braid::mpi {
namespace {

// The engine fails an operation at its deadline; the waiter allows it this much on top.
constexpr absl::Duration kWaitGrace = absl::Seconds(5);

class DupOp final : public Operation {
 public:
  DupOp(WorkPtr work, absl::Time deadline, absl::Duration timeout, MPI_Comm parent,
        std::shared_ptr<MPI_Comm> out)
      : Operation(nullptr, std::move(work), deadline, timeout),
        parent_(parent),
        out_(std::move(out)) {}

  absl::Status Start() override {
    RETURN_IF_MPI_ERROR(MPI_Comm_idup(parent_, &dup_, &request()));
    return absl::OkStatus();
  }
  absl::StatusOr<Progress> Advance() override { return Progress::kDone; }
  void Finish() override { *out_ = dup_; }

 private:
  const MPI_Comm parent_;
  MPI_Comm dup_ = MPI_COMM_NULL;  // written by MPI when the request completes
  const std::shared_ptr<MPI_Comm> out_;
};

class ExchangeOp final : public Operation {
 public:
  ExchangeOp(std::shared_ptr<GroupState> state, WorkPtr work, absl::Time deadline,
             absl::Duration timeout, const CallRecord& mine,
             std::shared_ptr<std::vector<CallRecord>> out)
      : Operation(std::move(state), std::move(work), deadline, timeout),
        mine_(mine),
        table_(static_cast<size_t>(group()->size)),
        out_(std::move(out)) {}

  absl::Status Start() override {
    RETURN_IF_MPI_ERROR(MPI_Iallgather(&mine_, CallRecord::kWords, MPI_INT64_T, table_.data(),
                                       CallRecord::kWords, MPI_INT64_T, group()->control,
                                       &request()));
    return absl::OkStatus();
  }
  absl::StatusOr<Progress> Advance() override { return Progress::kDone; }
  void Finish() override { *out_ = table_; }

 private:
  const CallRecord mine_;
  std::vector<CallRecord> table_;  // written by MPI
  const std::shared_ptr<std::vector<CallRecord>> out_;
};

absl::Status RunToCompletion(ProgressEngine& engine, std::unique_ptr<Operation> op) {
  WorkPtr work = op->work();
  const absl::Time deadline = op->deadline();
  RETURN_IF_ERROR(engine.Submit(std::move(op)));
  return work->WaitUntil(deadline + kWaitGrace);
}

}  // namespace

absl::StatusOr<MpiComm> DupComm(const std::shared_ptr<MpiRuntime>& runtime, MPI_Comm parent,
                                WorkInfo info, absl::Duration timeout) {
  ProgressEngine& engine = runtime->engine();
  auto dup = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  WorkPtr work = engine.NewWork(std::move(info), absl::ZeroDuration());
  RETURN_IF_ERROR(RunToCompletion(
      engine, std::make_unique<DupOp>(work, absl::Now() + timeout, timeout, parent, dup)));
  return MpiComm::Adopt(runtime, *dup);
}

absl::StatusOr<std::vector<CallRecord>> ExchangeRecords(const std::shared_ptr<MpiRuntime>& runtime,
                                                        std::shared_ptr<GroupState> state,
                                                        WorkInfo info, absl::Duration timeout,
                                                        const CallRecord& mine) {
  ProgressEngine& engine = runtime->engine();
  auto table = std::make_shared<std::vector<CallRecord>>();
  WorkPtr work = engine.NewWork(std::move(info), absl::ZeroDuration());
  RETURN_IF_ERROR(RunToCompletion(
      engine, std::make_unique<ExchangeOp>(std::move(state), work, absl::Now() + timeout, timeout,
                                           mine, table)));
  return std::move(*table);
}

}  // namespace braid::mpi
