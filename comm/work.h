// Work: the future every collective returns.
//
//   ASSIGN_OR_RETURN(WorkPtr w, group.AllReduce(buf, buf, n, DType::kF32, ReduceOp::Sum()));
//   w->OnComplete([](const absl::Status& s) { /* runs once, on the completing thread */ });
//   RETURN_IF_ERROR(w->Wait(absl::Seconds(30)));  // the op's status, or DeadlineExceeded
//
// Host side: Done(), Wait(timeout), OnComplete(callback). Device side: a device backend puts
// the completion event it recorded in device_event() so consumer streams can wait on it
// without the host blocking. Every Work knows which group, op, sequence number and label
// (e.g. the bucket) it belongs to, and every error it reports names them.
//
// Waiting: Wait() first spins (briefly, `spin` from BRAID_SPIN_US, since a sleeping hand-off
// costs ~40 us on small VMs), then sleeps on a condition variable until the deadline. A backend
// whose progress is driven by polling (MPI) installs a poller; Wait() then keeps calling it
// until completion or the deadline, as MPI_Wait would (backing off to short sleeps after 20 ms),
// and a progress thread covers the case where nobody waits.
#ifndef BRAID_COMM_WORK_H_
#define BRAID_COMM_WORK_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/tensor.h"

namespace braid {

struct WorkInfo {
  std::string group;  // group name, e.g. "world" or "world/shard0"
  std::string op;     // "allreduce", "reduce_scatter", ...
  uint64_t seq = 0;   // per-group sequence number, identical on every rank
  std::string label;  // caller's label, e.g. "bucket 3"; may be empty

  std::string Describe() const;  // "allreduce #12 on group 'world' (bucket 3)"
};

class Work;
class WorkPool;

// Told once when a Work it observes finishes (the flight recorder, comm/flight_recorder.h).
// Runs on the completing thread under the Work's lock, before anyone sees the Work done; must
// not call back into the Work or block on peers.
class WorkObserver {
 public:
  virtual ~WorkObserver() = default;
  // `token`: what Observe() was given; `started_ns`: Work::started_ns().
  virtual void WorkFinished(uint64_t token, const absl::Status& status, int64_t started_ns) = 0;
  // The backend began the work (Work::MarkStarted); called under the Work's lock, at most twice
  // with the same time. Must not call back into the Work.
  virtual void WorkStarted(uint64_t token, int64_t started_ns) = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Work {
 public:
  using Callback = std::function<void(const absl::Status&)>;

  static WorkPtr Create(WorkInfo info, absl::Duration spin = absl::Microseconds(20));
  static WorkPtr Completed(WorkInfo info, absl::Status status);

  // Only WorkPool can make one (std::allocate_shared needs a public constructor).
  class PoolKey {
    friend class WorkPool;
    explicit PoolKey() = default;
  };
  Work(PoolKey, WorkInfo info, absl::Duration spin) : Work(std::move(info), spin) {}

  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Consumer side -------------------------------------------------------------------------
  bool Done() const { return done_.load(std::memory_order_acquire); }
  // The op's final status once Done(); DeadlineExceeded (naming the op) if `timeout` passes
  // first. The op itself keeps running: a later Wait may still succeed.
  absl::Status Wait(absl::Duration timeout);
  absl::Status WaitUntil(absl::Time deadline);
  // Final status; FailedPrecondition if not Done() yet.
  absl::Status status() const;
  // Runs `cb` exactly once with the final status: now (on this thread) if already done, else
  // on the thread that completes the work. Callbacks must not block. A callable of at most
  // 16 trivially copyable bytes (e.g. [this, index]) is stored without allocating.
  void OnComplete(Callback cb);
  DeviceEvent device_event() const { return device_event_; }
  const WorkInfo& info() const { return info_; }
  // Tells `observer` (one per Work; a later call replaces it) when the work finishes: now, on
  // this thread, if it already has. Takes the Work's lock once; allocates nothing.
  void Observe(std::shared_ptr<WorkObserver> observer, uint64_t token);
  // Wall-clock ns (Unix epoch) at which the backend began the op (MarkStarted); 0: not reported.
  int64_t started_ns() const { return started_ns_.load(std::memory_order_relaxed); }

  // Producer side (backends) --------------------------------------------------------------
  // Completes the work; the first call wins, later calls are ignored (returns false).
  bool Complete(absl::Status status);
  void set_device_event(DeviceEvent e) { device_event_ = e; }
  // The transport begins the op now (for the flight recorder's "started" time); first call wins.
  void MarkStarted();
  // Installs a function Wait() calls while it waits (polling-driven backends). Must be set
  // before the Work is handed out; must be safe to call from any thread, repeatedly.
  void set_poller(std::function<void()> poller) { poller_ = std::move(poller); }

 private:
  Work(WorkInfo info, absl::Duration spin);

  WorkInfo info_;
  int64_t spin_ns_;
  std::atomic<bool> done_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  absl::Status status_;  // guarded by mu_; immutable once done_
  // guarded by mu_; inline room for the usual one or two consumers (no allocation)
  absl::InlinedVector<Callback, 2> callbacks_;
  DeviceEvent device_event_;
  std::function<void()> poller_;
  std::shared_ptr<WorkObserver> observer_;  // guarded by mu_; taken by Complete()
  uint64_t observer_token_ = 0;             // guarded by mu_
  std::atomic<int64_t> started_ns_{0};
};

}  // namespace braid

#endif  // BRAID_COMM_WORK_H_
