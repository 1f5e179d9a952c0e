// ProgressEngine: the MPI lock, the table of operations in flight, and the progress thread.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<ProgressEngine> engine, ProgressEngine::Create());
//   WorkPtr work = engine->NewWork(info, spin);
//   RETURN_IF_ERROR(engine->Submit(std::make_unique<MyOp>(state, work, deadline, timeout)));
//   RETURN_IF_ERROR(work->Wait(absl::Seconds(10)));   // polls the engine while it waits
//
// Every MPI call of the engine happens under mu() (MPI may only give MPI_THREAD_SERIALIZED;
// the exceptions, under MPI_THREAD_MULTIPLE only, are Split's MPI_Comm_split and the comm
// threads' blocking calls). Operations complete without the caller polling: a thread in
// Work::Wait drives progress itself (as MPI_Wait would), and the progress thread polls when
// nobody waits. Whoever observes a completion runs the operation's finishing step once, then
// completes its Work.
//
// Deadlines and errors: an operation still running at its deadline, or whose request completes
// with an MPI error, fails with a status naming group, op and sequence number and fails its
// group; MPI cannot cancel a collective, so its buffers are leaked rather than freed under MPI,
// and Shutdown() then reports that MPI must not be finalized. Job aborts (comm/abort_domain.h)
// fail every operation in flight; lock order: the domain, then the MPI lock.
// Details: docs/design/backends.md, "The mpi backend".
#ifndef BRAID_BACKENDS_MPI_PROGRESS_ENGINE_H_
#define BRAID_BACKENDS_MPI_PROGRESS_ENGINE_H_

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/mpi/abort_channel.h"
#include "backends/mpi/operation.h"
#include "comm/abort_domain.h"
#include "comm/work.h"

namespace braid::mpi {

class ProgressEngine : public std::enable_shared_from_this<ProgressEngine> {
 public:
  // Starts the progress thread (ResourceExhausted when it cannot be started). MPI must be
  // initialized, and stay so until Shutdown().
  static absl::StatusOr<std::shared_ptr<ProgressEngine>> Create();
  // Joins the thread (Shutdown() if not done yet). Operations MPI still owns are leaked.
  ~ProgressEngine();
  ProgressEngine(const ProgressEngine&) = delete;
  ProgressEngine& operator=(const ProgressEngine&) = delete;

  // The MPI lock: hold it around every MPI call.
  std::mutex& mu() { return mu_; }

  // A Work whose Wait() drives this engine.
  WorkPtr NewWork(WorkInfo info, absl::Duration spin);

  // Starts `op` (its first MPI call) and tracks it until it completes. An error means nothing
  // was started; it also fails the op's group when the MPI call itself failed.
  absl::Status Submit(std::unique_ptr<Operation> op);

  // One round of progress: tests the requests in flight, advances operations, enforces
  // deadlines and finishes what completed. Safe from any thread; Work pollers call it.
  void Poll();

  // For a group being destroyed (mpi_group.h), before its communicators are freed: drives
  // progress, as a waiter would, until none of `group`'s operations is in flight any more.
  // Each one completes (its peers issued it too) or fails at its own deadline, or when the job
  // aborts, and its Work completes accordingly; so the wait is bounded by the latest deadline
  // among them. Returns how many of the group's operations MPI still owns afterwards (failed
  // while their request was live: zombies); while any does, MPI may still progress a schedule
  // on the group's communicators, so they must not be freed (Open MPI's libnbc does not keep a
  // freed communicator alive for the requests on it: its progress then crashes).
  size_t DrainGroup(const GroupState* group);

  // Stops the progress thread and drains what is in flight (bounded by the operations'
  // deadlines). Returns true when MPI owns no buffer of ours any more, so MPI may be finalized.
  // Later Submit() calls fail and Poll() does nothing. Closes the abort channel.
  bool Shutdown();
  // This process leaves the job now (its world was never shut down: the program returned from
  // main or called exit): the leave notice Shutdown would send, waited for up to 200 ms so it
  // is out before the process ends. A no-op once the job aborted or the notice went out.
  void LeaveAtExit();

  // See the header comment. `report`: a group's own failure aborts the job
  // (BRAID_ABORT_ON_FAILURE). Once per engine: later calls are ignored (the channel closed).
  void AttachAbortDomain(std::shared_ptr<AbortDomain> domain, std::unique_ptr<AbortChannel> channel,
                         int world_rank, bool report);
  bool has_abort_channel();

  // For work run outside the engine (comm_thread.h): a group failed by its own call; reported
  // to the abort domain like the engine's own failures (a no-op without report). Call it with
  // no lock held.
  void ReportGroupFailure(const absl::Status& cause);
  // A communication thread was left inside a blocking MPI call (it failed its deadline or was
  // aborted and never returned): Shutdown() then reports that MPI must not be finalized.
  void NoteStuckThread();

 private:
  struct Finished {
    std::unique_ptr<Operation> op;  // null when MPI still owns it (kept in zombies_)
    WorkPtr work;
    absl::Status status;
  };
  using FinishedList = absl::InlinedVector<Finished, 4>;

  ProgressEngine() = default;
  void ThreadMain();
  void PollLocked(absl::Time now, FinishedList* out);
  // Tests the active requests; marks completed ones MPI_REQUEST_NULL and fills errors_.
  void TestRequestsLocked();
  void PollZombiesLocked();
  void RemoveLocked(size_t i, absl::Status status, FinishedList* out);
  static void RunFinished(FinishedList& finished);
  // A group failed by its own operation: remembered, reported to the domain after unlock.
  void NoteGroupFailureLocked(const absl::Status& cause);
  // Polls the abort channel and, once the domain aborted, fails every operation in flight.
  void PollAbortsLocked(FinishedList* out);
  // With the MPI lock released: hands what PollAbortsLocked / NoteGroupFailureLocked found to
  // the domain.
  void DeliverAborts();
  // A peer's abort is waiting and due (a leave notice's grace has passed).
  bool PeerAbortDueLocked() const;
  // The leave notice (once; not after an abort), `how` saying how this process left.
  void SendLeaveLocked(absl::string_view how);

  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_. In submission order, so a group's operations advance in issue order.
  std::vector<std::unique_ptr<Operation>> ops_;
  std::vector<std::unique_ptr<Operation>> zombies_;  // failed, but MPI still owns their buffers
  std::vector<MPI_Request> requests_;                // scratch for MPI_Testsome
  std::vector<int> indices_;
  std::vector<MPI_Status> statuses_;
  std::vector<absl::Status> errors_;
  bool asleep_ = false;  // the thread waits on cv_ with nothing in flight
  bool stopping_ = false;
  bool shut_down_ = false;
  // When a waiter last polled (absl::GetCurrentTimeNanos); the thread keeps out of its way.
  std::atomic<int64_t> last_waiter_poll_ns_{0};

  // Job aborts; guarded by mu_ except the domain (set once before use).
  std::shared_ptr<AbortDomain> domain_;
  std::unique_ptr<AbortChannel> channel_;
  AbortDomain::Subscription abort_sub_;
  int world_rank_ = -1;
  bool report_failures_ = false;
  absl::Status to_report_;                  // this process's first group failure, not yet told
  std::optional<PeerAbort> peer_abort_;     // a peer's abort, not yet handed to the domain
  absl::Time peer_abort_due_;               // when to hand it over (a leave notice: + grace)
  absl::Status abort_cause_;                // the domain's cause once it aborted
  std::atomic<bool> abort_pending_{false};  // abort_cause_ set; ops in flight not yet failed

  std::atomic<int> stuck_threads_{0};

  std::thread thread_;
};

// The failures of an operation: its deadline passed (naming group, op, sequence number and
// timeout); its group failed with `cause` (read the group's failure under mu()).
absl::Status DeadlineStatus(const Operation& op);
absl::Status AbortedByGroup(const Operation& op, const absl::Status& cause);

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_PROGRESS_ENGINE_H_
