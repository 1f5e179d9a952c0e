// CommThread: one group's communication thread, running its collectives as *blocking* MPI calls
// (MPI_Allreduce, MPI_Reduce_scatter_block, ...) in a FIFO, without the MPI lock. Open MPI's
// blocking collectives use its tuned algorithms and are faster than its nonblocking ones from
// 1 MiB up; a thread sitting in the blocking call overlaps them with the caller's compute.
//
//   CommThread::Config cfg{state, comm, engine, domain, world_rank};
//   ASSIGN_OR_RETURN(std::unique_ptr<CommThread> thread, CommThread::Create(cfg));
//   RETURN_IF_ERROR(thread->Submit(std::move(op)));   // op: a CollectiveOp; completes its Work
//
// RANK-ORDER CONTRACT: every rank issues a group's collectives in the same order. The queue is
// FIFO, drained by one thread on a communicator of its own, so every rank enters the blocking
// calls in issue order. Needs MPI_THREAD_MULTIPLE (MpiEngineChoice says nonblocking otherwise).
//
// Deadlines: a watchdog thread fails a call still queued or running at its deadline with
// DeadlineExceeded (naming group, op and sequence number), fails the group and reports to the
// job's abort domain; a call abandoned inside MPI keeps its buffers alive and is never
// finished into the caller's. Destruction drains the queue, waits for the running call, then
// joins (or detaches and leaks an abandoned call, telling the engine not to finalize MPI).
// Why, and the completion hand-off: docs/design/backends.md, "The mpi backend".
#ifndef BRAID_BACKENDS_MPI_COMM_THREAD_H_
#define BRAID_BACKENDS_MPI_COMM_THREAD_H_

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backends/mpi/collective_op.h"
#include "backends/mpi/group_state.h"
#include "backends/mpi/progress_engine.h"
#include "comm/abort_domain.h"
#include "comm/group.h"

namespace braid::mpi {

// Which engine runs a collective (BRAID_MPI_ENGINE): "sized" is the rule below; "auto" (the
// default) is "sized" where every rank of the node has a spare core for its comm thread (ranks
// on this node x 2 <= the node's cores), else "nonblocking" (ResolveAuto).
enum class MpiEngine { kAuto, kSized, kBlocking, kNonblocking };
absl::StatusOr<MpiEngine> ParseMpiEngine(absl::string_view name);
// kAuto -> kSized or kNonblocking for `local_ranks` processes on a node of `cores` cores;
// other engines unchanged.
MpiEngine ResolveAuto(MpiEngine engine, int local_ranks, int cores);

// The rule, from bench/collective_latency --backend=mpi (docs/performance.md, "MPI engine"):
// `sized` sends a call to the comm thread (blocking MPI) when its payload (count x dtype size)
// is at least kBlockingMinBytes, else to the nonblocking engine driven by the waiter, whose
// small-message latency is lower because the waiter itself polls MPI (no thread hand-off,
// which costs ~5 us here). Measured at 2 ranks on 2 vCPUs: nonblocking wins at <= 512 B
// (2.0-2.5 us vs ~6 us), blocking from 4 KiB (7 vs 10 us) and by 2-4x from 1 MiB up (tuned vs
// libnbc algorithms). Barriers stay nonblocking. Without MPI_THREAD_MULTIPLE every call is
// nonblocking. A CPU-bound trainer with no spare core per rank runs faster on the nonblocking
// engine (a blocking Open MPI call busy-polls on the comm thread against the trainer's
// compute: bench/torch_step 0.65-0.96x DDP vs 0.92-1.43x), hence `auto`'s core check. Known
// limit (measured, not encoded): with 4 ranks on 2 vCPUs the crossover lies between 64 KiB
// and 1 MiB.
inline constexpr size_t kBlockingMinBytes = 4096;
bool UsesCommThread(MpiEngine engine, bool thread_multiple, const CollectiveArgs& args);

class CommThread {
 public:
  struct Config {
    std::shared_ptr<GroupState> state;
    MPI_Comm comm = MPI_COMM_NULL;  // owned from here on (freed with MPI_Comm_free)
    std::shared_ptr<ProgressEngine> engine;
    std::shared_ptr<AbortDomain> domain;  // may be null
  };

  // Starts the comm thread and the watchdog.
  static absl::StatusOr<std::unique_ptr<CommThread>> Create(Config config);
  // See the header comment: drains, then joins (or detaches a thread stuck in MPI).
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `op` behind the group's earlier calls. Fails (nothing queued) when the group has
  // failed or the job aborted.
  absl::Status Submit(std::unique_ptr<CollectiveOp> op);

  struct Shared;  // the state both threads share; outlives this object when a thread is stuck

 private:
  explicit CommThread(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_COMM_THREAD_H_
