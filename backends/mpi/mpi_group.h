// The `mpi` backend's Group: one process per rank, collectives as MPI nonblocking calls (the
// progress engine) or as blocking calls on a communication thread per group (comm_thread.h).
//
//   ASSIGN_OR_RETURN(WorkPtr w, world->AllReduce(buf, buf, n, DType::kBF16, ReduceOp::Avg()));
//   w->OnComplete([](const absl::Status& s) { ... });   // fires without anyone waiting
//   ASSIGN_OR_RETURN(std::unique_ptr<Group> half, world->Split(rank % 2, rank));
//
// RANK-ORDER CONTRACT (see comm/group.h): every rank issues this group's collectives and
// Splits in the same order, with matching arguments. MPI cannot see a mismatch itself: with
// BRAID_VALIDATE_COLLECTIVES=1 each collective first exchanges a small record and a mismatch
// fails on every rank naming the ranks and their calls; without it, only the deadline (or MPI,
// when sizes differ) catches it. Calls on one MpiGroup must not run concurrently; different
// groups may be used from different threads.
//
// Every collective has a deadline; one that misses it fails with DeadlineExceeded and fails the
// group (later calls return that cause at once). A call refused up front consumes no sequence
// number. Split is collective and blocks: an exchange of (color, key) under the deadline, then
// MPI_Comm_split, which has none. Destruction runs what this rank issued to completion (or to
// its deadline) before freeing the communicators. Why each of these, and the residual risks:
// docs/design/backends.md, "The mpi backend".
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
