// The `mpi` backend's Group: one process per rank, collectives as MPI nonblocking calls.
//
// RANK-ORDER CONTRACT (see comm/group.h): every rank issues this group's collectives and
// Splits in the same order, with matching arguments. MPI matches the collectives of a
// communicator by the order in which they are issued and cannot see a mismatch itself: with
// BRAID_VALIDATE_COLLECTIVES=1 each collective first exchanges a small record (kind, count,
// dtype, op, root) and a mismatch fails on every rank with InvalidArgument naming the ranks
// and their calls; without it, a mismatch is caught only by the deadline (or by MPI, when
// sizes differ). Calls on one MpiGroup must not run concurrently (the scheduler serializes
// them); different groups may be used from different threads.
//
//   ASSIGN_OR_RETURN(WorkPtr w, world->AllReduce(buf, buf, n, DType::kBF16, ReduceOp::Avg()));
//   w->OnComplete([](const absl::Status& s) { ... });   // fires without anyone waiting
//   ASSIGN_OR_RETURN(std::unique_ptr<Group> half, world->Split(rank % 2, rank));
//
// Each group owns two communicators: `data` carries the nonblocking collectives, `control`
// carries the record exchanges and Split (so they never reorder the data calls). Under
// MPI_THREAD_MULTIPLE (and BRAID_MPI_ENGINE other than nonblocking) it also owns a
// communication thread with a third communicator: calls that UsesCommThread() picks (by
// kind and size, the same on every rank) run there as blocking MPI calls, in issue order
// (comm_thread.h); the others go to the nonblocking engine. Each communicator sees its own
// calls in issue order on every rank, so the two paths never reorder each other's calls. Every
// collective has a deadline (CollectiveOptions::timeout, else Options::timeout); one that misses it
// fails with DeadlineExceeded and fails the group: later calls return that cause at once. A call
// the backend refuses up front (e.g. Unimplemented for a count above INT_MAX) consumes no sequence
// number and no turn, so the next call matches its peers as if it had not been made.
//
// SPLIT is collective and blocks its caller, in two steps:
//   1. exchange: an MPI_Iallgather of every rank's (color, key) record on `control`, under the
//      deadline like a collective. Its completion on this rank proves that every rank of the
//      group has entered this Split (each one's record arrived), and every rank then holds the
//      same table, so the checks that follow (same call, valid colors) give the same verdict
//      everywhere: all ranks fail, or all go on.
//   2. MPI_Comm_split on `control`, which has no deadline: MPI has no nonblocking split
//      (MPI_Comm_idup, the only nonblocking constructor, cannot change membership). It is
//      entered only after step 1, and nothing rank-local, not even a failure of this group
//      since the exchange, makes a rank back out, so every peer arrives. Residual risk: a peer
//      that does not arrive after all leaves this rank blocked in MPI_Comm_split for good. That
//      needs (a) the peer's exchange to fail at its own deadline, or to be aborted by a failure
//      of the group in the same progress pass, in the instant after its record reached the
//      others, or (b) the peer process to hang between the two steps (a dead process ends the
//      job: Open MPI's launcher aborts it). Under MPI_THREAD_MULTIPLE (always when the host
//      initialized MPI; what Debian's Open MPI 4.1 provides) the split runs without the MPI lock,
//      so only the calling thread is stuck: other groups' collectives keep completing and
//      their deadlines keep firing. Under MPI_THREAD_SERIALIZED it must hold the MPI lock, and
//      a stuck split stalls every MPI call of the backend in the process.
//
// DESTRUCTION runs, rather than abandons, what this rank issued (its peers issued the same calls
// and wait for this rank's part): the comm thread drains its queue (comm_thread.h), then the
// destructor drives the nonblocking engine until none of the group's calls is in flight
// (ProgressEngine::DrainGroup). Each such call completes normally, with its result, or fails
// at its own deadline with DeadlineExceeded (a peer never issued it); so the destructor blocks
// at most until the latest deadline of the group's calls in flight. Only then are the
// communicators freed: Open MPI 4.1's libnbc keeps progressing a request's schedule on its
// communicator and crashes if that communicator was freed under it (MPI_Comm_free is not safe
// with nonblocking collectives in flight, whatever the standard says). A call that failed at
// its deadline while MPI still owns its request leaves the communicators leaked, not freed,
// with one error logged for the group; the engine keeps the call's buffers (progress_engine.h).
#ifndef BRAID_BACKENDS_MPI_MPI_GROUP_H_
#define BRAID_BACKENDS_MPI_MPI_GROUP_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/mpi/comm_thread.h"
#include "backends/mpi/group_state.h"
#include "backends/mpi/mpi_comm.h"
#include "backends/mpi/mpi_runtime.h"
#include "comm/group.h"

namespace braid::mpi {

class MpiGroup final : public Group {
 public:
  struct Config {
    absl::Duration timeout = absl::Seconds(300);  // default deadline of every call
    absl::Duration spin = absl::Microseconds(20);
    bool validate = false;                // BRAID_VALIDATE_COLLECTIVES
    bool abort_on_failure = true;         // BRAID_ABORT_ON_FAILURE (comm/abort_domain.h)
    MpiEngine engine = MpiEngine::kAuto;  // BRAID_MPI_ENGINE (comm_thread.h)
  };

  // A group over `data` (owned); makes its control communicator (collective over `data`).
  static absl::StatusOr<std::unique_ptr<Group>> Create(std::shared_ptr<MpiRuntime> runtime,
                                                       MpiComm data, std::string name,
                                                       const Config& config);
  // Blocks until this rank's calls on the group are done or failed (see DESTRUCTION above).
  ~MpiGroup() override;

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  const std::string& name() const override { return state_->name; }
  absl::string_view backend_name() const override { return "mpi"; }
  Capabilities capabilities() const override { return MpiCapabilities(); }

  static Capabilities MpiCapabilities();

 protected:
  absl::StatusOr<WorkPtr> Launch(const CollectiveArgs& args) override;
  absl::StatusOr<std::unique_ptr<Group>> DoSplit(int color, int key, std::string name) override;
  int world_rank() const override { return world_rank_; }

 private:
  MpiGroup(std::shared_ptr<MpiRuntime> runtime, MpiComm data, MpiComm control,
           std::shared_ptr<GroupState> state, const Config& config,
           std::unique_ptr<CommThread> comm_thread);

  const std::shared_ptr<MpiRuntime> runtime_;  // first: outlives the communicators
  MpiComm data_;
  MpiComm control_;
  const std::shared_ptr<GroupState> state_;
  const Config config_;
  // Blocking collectives (comm_thread.h); null when every call is nonblocking.
  std::unique_ptr<CommThread> comm_thread_;
  const int world_rank_;
  // Claimed only by calls that were accepted (see Launch), so identical on every rank.
  uint64_t next_seq_ = 0;   // collectives and splits
  uint64_t next_turn_ = 0;  // nonblocking collectives only (validate: order on `data`)
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_MPI_GROUP_H_
