#include "backends/mpi/mpi_group.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/mpi/call_record.h"
#include "backends/mpi/collective_op.h"
#include "backends/mpi/group_setup.h"
#include "backends/mpi/mpi_errors.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::mpi {

absl::StatusOr<std::unique_ptr<Group>> MpiGroup::Create(std::shared_ptr<MpiRuntime> runtime,
                                                        MpiComm data, std::string name,
                                                        const Config& config) {
  ASSIGN_OR_RETURN(MpiComm control,
                   DupComm(runtime, data.get(), WorkInfo{name, "create", 0, ""}, config.timeout));
  auto state =
      std::make_shared<GroupState>(std::move(name), data.rank(), data.size(), config.validate);
  state->data = data.get();
  state->control = control.get();
  std::unique_ptr<CommThread> comm_thread;
  if (runtime->thread_multiple() && config.engine != MpiEngine::kNonblocking) {
    ASSIGN_OR_RETURN(MpiComm serial,
                     DupComm(runtime, data.get(), WorkInfo{state->name, "create", 0, "comm thread"},
                             config.timeout));
    CommThread::Config tc;
    tc.state = state;
    tc.comm = serial.Release();
    tc.engine = runtime->engine().shared_from_this();
    tc.domain = runtime->abort_domain();
    ASSIGN_OR_RETURN(comm_thread, CommThread::Create(std::move(tc)));
  }
  return std::unique_ptr<Group>(new MpiGroup(std::move(runtime), std::move(data),
                                             std::move(control), std::move(state), config,
                                             std::move(comm_thread)));
}

MpiGroup::MpiGroup(std::shared_ptr<MpiRuntime> runtime, MpiComm data, MpiComm control,
                   std::shared_ptr<GroupState> state, const Config& config,
                   std::unique_ptr<CommThread> comm_thread)
    : runtime_(std::move(runtime)),
      data_(std::move(data)),
      control_(std::move(control)),
      state_(std::move(state)),
      config_(config),
      comm_thread_(std::move(comm_thread)),
      world_rank_(runtime_->world_rank()) {
  SetAbortDomain(runtime_->abort_domain());
}

MpiGroup::~MpiGroup() {
  comm_thread_.reset();  // runs what this rank issued, as its peers do (comm_thread.h)
  // The nonblocking calls this rank issued run to completion too (their peers issued them),
  // or fail at their deadlines: MPI_Comm_free must not run under a live request (see
  // mpi_group.h, "Destruction").
  const size_t live = runtime_->engine().DrainGroup(state_.get());
  {
    std::lock_guard<std::mutex> lock(runtime_->mu());
    state_->closed = true;
    state_->data = MPI_COMM_NULL;
    state_->control = MPI_COMM_NULL;
  }
  if (live > 0) {
    Log().error(
        "mpi backend: group '{}' destroyed with {} nonblocking call(s) that failed but "
        "that MPI still runs; its communicators are leaked instead of freed under them",
        state_->name, live);
    // Deliberate leak: MPI may still progress those calls' schedules on these communicators.
    static_cast<void>(control_.Release());
    static_cast<void>(data_.Release());
    return;
  }
  control_.Reset();
  data_.Reset();
}

Capabilities MpiGroup::MpiCapabilities() {
  Capabilities c;
  c.host_memory = true;
  c.native_avg = false;
  c.native_premul_sum = false;
  c.native_half = false;
  c.async_progress = true;
  c.split = true;
  c.deterministic = false;  // MPI picks the reduction order
  return c;
}

absl::StatusOr<WorkPtr> MpiGroup::Launch(const CollectiveArgs& in) {
  CollectiveOp::Params p;
  p.args = in;
  p.args.options.label = {};  // the label lives in the Work; don't keep the view
  p.timeout = in.options.timeout > absl::ZeroDuration() ? in.options.timeout : config_.timeout;
  p.deadline = absl::Now() + p.timeout;
  // The same choice on every rank (kind, count, dtype and the shared configuration).
  const bool blocking =
      comm_thread_ != nullptr && UsesCommThread(config_.engine, runtime_->thread_multiple(), in);
  WorkInfo info{state_->name, std::string(CollectiveName(in.kind)), next_seq_,
                std::string(in.options.label)};
  // The call's sequence number and turn are only claimed once Create accepted it: a refused
  // call (on every rank alike) must not leave a gap that the next collective waits on forever.
  if (blocking) {
    // The comm thread completes it; a waiter busy-polls (yielding) instead of sleeping, so
    // the hand-off costs no futex wake-up (comm/work.h).
    p.work = Work::Create(std::move(info), config_.spin);
    p.work->set_poller([] {});
  } else {
    p.work = runtime_->engine().NewWork(std::move(info), config_.spin);
  }
  p.group = state_;
  p.turn = state_->validate && !blocking ? next_turn_ : 0;
  p.world_rank = world_rank_;
  p.ops = &runtime_->ops();
  WorkPtr work = p.work;
  ASSIGN_OR_RETURN(std::unique_ptr<CollectiveOp> op, CollectiveOp::Create(std::move(p)));
  // Claimed from here on, even if Submit fails: a failed Submit fails the group (or finds it
  // failed or destroyed already), so no later collective waits on this turn.
  ++next_seq_;
  if (blocking) {
    RETURN_IF_ERROR(comm_thread_->Submit(std::move(op)));
    return work;
  }
  if (state_->validate) ++next_turn_;
  RETURN_IF_ERROR(runtime_->engine().Submit(std::move(op)));
  return work;
}

absl::StatusOr<std::unique_ptr<Group>> MpiGroup::DoSplit(int color, int key, std::string name) {
  const WorkInfo info{state_->name, "split", next_seq_++, ""};
  const std::string what = info.Describe();
  ASSIGN_OR_RETURN(std::vector<CallRecord> table,
                   ExchangeRecords(runtime_, state_, info, config_.timeout,
                                   SplitRecord(color, key, world_rank_)));
  // Every rank holds the same table, so every rank takes the same branch below.
  RETURN_IF_ERROR(CheckSameCall(table, what));
  RETURN_IF_ERROR(CheckSplitColors(table, state_->name));
  // Past this point every rank holds the same table and goes on to MPI_Comm_split (see
  // mpi_group.h for why it is blocking and what that leaves): nothing rank-local, not even a
  // failure of this group since the exchange, may make one rank back out now.
  MPI_Comm control = MPI_COMM_NULL;
  {
    std::lock_guard<std::mutex> lock(runtime_->mu());
    if (state_->closed) return state_->CheckUsableLocked();  // no communicator left
    control = state_->control;
  }
  MPI_Comm child = MPI_COMM_NULL;
  absl::Status split;
  {
    // Under MPI_THREAD_MULTIPLE the split runs without the MPI lock: the engine (other
    // groups' collectives and deadlines) keeps going while this thread waits for its peers.
    // Nothing else is issued on `control` meanwhile: calls on a group are serialized.
    std::unique_lock<std::mutex> serialized(runtime_->mu(), std::defer_lock);
    if (!runtime_->thread_multiple()) serialized.lock();
    split =
        MpiStatus(MPI_Comm_split(control, color == kNoColor ? MPI_UNDEFINED : color, key, &child),
                  "MPI_Comm_split");
  }
  if (!split.ok()) {
    std::lock_guard<std::mutex> lock(runtime_->mu());
    state_->MarkFailedLocked(split);
    return WithContext(split, what);
  }
  if (child == MPI_COMM_NULL) return std::unique_ptr<Group>();
  ASSIGN_OR_RETURN(MpiComm data, MpiComm::Adopt(runtime_, child));
  return Create(runtime_, std::move(data), std::move(name), config_);
}

}  // namespace braid::mpi
