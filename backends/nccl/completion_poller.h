// CompletionPoller: the progress thread that turns device completion into host futures.
//
// A launch records a completion event on the group's comm stream after ncclGroupEnd and hands
// the poller a Tracked entry: the Work(s) to complete, the event, the communicator, the
// deadline. The thread polls, in issue order, cudaEventQuery on each event and
// ncclCommGetAsyncError on each communicator:
//   - event complete                   -> the Works complete OK (callbacks run on this thread);
//   - NCCL asynchronous error          -> the communicator is aborted and every entry on it
//                                         fails with NCCL's error, naming group, op, sequence;
//   - deadline passed, event pending   -> the communicator is aborted (ncclCommAbort), the entry
//                                         fails with DeadlineExceeded naming group, op, sequence
//                                         number and label, and so does everything after it on
//                                         that communicator (aborted);
//   - cudaEventQuery error             -> the same, with CUDA's error.
// Futures are never resolved from cudaLaunchHostFunc callbacks (no CUDA calls allowed there).
//
// Lifetimes: an entry holds the communicator (so it is finalized only after its last Work is
// observed) and `keep_alive` (Braid-owned buffers the collective reads or writes). Completion
// events are the Works' device_event(): after completion the poller keeps each event until
// every Work that exposes it has been released (weak references), then destroys it, so a
// consumer may cudaStreamWaitEvent on work->device_event() for as long as it holds the Work
// (and the poller lives: it is shared by a world group and all groups split from it).
//
//   ASSIGN_OR_RETURN(std::shared_ptr<CompletionPoller> poller, CompletionPoller::Create(cuda, 0));
//   poller->Track({works, std::move(event), comm, deadline, timeout, nullptr});
#ifndef BRAID_BACKENDS_NCCL_COMPLETION_POLLER_H_
#define BRAID_BACKENDS_NCCL_COMPLETION_POLLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/nccl/cuda_api.h"
#include "backends/nccl/cuda_handles.h"
#include "backends/nccl/nccl_comm.h"
#include "comm/work.h"

namespace braid::nccl {

class CompletionPoller {
 public:
  struct Tracked {
    // works[0] describes the launch (its info names it in errors); any others complete with it
    // (the members of a coalesced bucket).
    absl::InlinedVector<WorkPtr, 1> works;
    CudaEvent event;  // recorded after ncclGroupEnd on the comm stream
    std::shared_ptr<NcclComm> comm;
    absl::Time deadline;
    absl::Duration timeout;
    std::shared_ptr<void> keep_alive;  // released once the entry is finished
  };

  // Starts the thread (ResourceExhausted when it cannot be started).
  // `device`: the CUDA device of every event and stream tracked (the thread makes it current).
  static absl::StatusOr<std::shared_ptr<CompletionPoller>> Create(std::shared_ptr<CudaApi> cuda,
                                                                  int device);
  // Called on the poller's thread (no lock held) with the cause each time it aborts a
  // communicator for a failure of its own (not for one already failed): the job's abort hub.
  void SetFailureHandler(std::function<void(const absl::Status&)> handler);
  // Stops taking entries, lets the thread finish what is tracked (bounded by the entries'
  // deadlines: a stuck one is aborted at its deadline), joins it, destroys retired events.
  ~CompletionPoller();
  CompletionPoller(const CompletionPoller&) = delete;
  CompletionPoller& operator=(const CompletionPoller&) = delete;

  void Track(Tracked t);

  // For tests and diagnostics.
  size_t in_flight() const;
  size_t retired_events() const;

 private:
  // The thread's state. The thread holds it too, so the poller may be released from one of its
  // own completion callbacks (the thread is then detached and ends on its own).
  struct Core;

  CompletionPoller() = default;

  std::shared_ptr<Core> core_;
  std::thread thread_;
};

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_COMPLETION_POLLER_H_
