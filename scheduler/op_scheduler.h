// OpScheduler: one rank's launch queue between the reducer / gatherer and the backend. It splits
// large reductions into credit-sized partitions (scheduler/partition.h), keeps at most a credit
// of reduction bytes in flight per group, and lets urgent operations (the parameter gathers the
// model waits for next) go ahead of reductions whose results are needed only at the step.
//
//   OpSchedulerConfig sc;
//   sc.credit_bytes = 4 << 20;  // partitions of at most 4 MiB, 4 MiB in flight per group
//   sc.priorities = true;       // gathers in flight hold back further reduction partitions
//   ASSIGN_OR_RETURN(auto ops, OpScheduler::Create(sc, world.get()));  // collective: checks sc
//   ReducerConfig rc;  rc.scheduler = ops.get();    // reductions go through it
//   GathererConfig gc; gc.scheduler = ops.get();    // gathers are reported as urgent
//
// Contract:
//  - Priorities: 0 urgent (a gather the model waits for), 1 reduction. Reductions run in
//    submission order (bucket order, each bucket's partitions in increasing order).
//  - Rank order: per group, reductions are issued strictly in submission order; partitions are
//    computed from plan data only; credit, priority and max_hold decide only WHEN a group's next
//    operation is issued, never WHICH. No clock chooses an order. Create checks every rank's
//    credit_bytes and priorities (one small all-gather).
//  - Results are bit-identical to the unpartitioned call where the backend's per-element order
//    does not depend on the call's size (`local` always, `mpi` at 2 ranks). credit_bytes == 0:
//    no partitions and no credit limit.
//  - Device groups are partitioned and held the same way on the host side of the stream; a
//    reduction's Work completes (and its device_event() is recorded) after its last partition.
//  - Any thread may call; completion callbacks never block. Must outlive every reducer and
//    gatherer using it; the destructor cancels unissued reductions and waits (config.timeout)
//    for those in flight.
// Partitions, credit, staging memory, device streams and timeline rows in full:
// docs/design/scheduler.md.
#ifndef BRAID_SCHEDULER_OP_SCHEDULER_H_
#define BRAID_SCHEDULER_OP_SCHEDULER_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "comm/work.h"
#include "comm/work_pool.h"
#include "scheduler/memory_stats.h"
#include "scheduler/partition.h"
#include "scheduler/timeline.h"

namespace braid::sched {

struct OpSchedulerConfig {
  // Largest partition (bytes of input per rank-call) and the most reduction bytes in flight per
  // group. 0: unpartitioned, unlimited.
  size_t credit_bytes = 0;
  // Urgent operations in flight hold back reduction partitions not yet issued.
  bool priorities = true;
  // When urgent work holds reductions back: kInFlight, while any tracked urgent operation is in
  // flight; kWaited, only while some thread also waits for one (a WaitScope: the gatherer's
  // WaitParams), i.e. while the model is stalled on it. Either way only WHEN, never order.
  enum class Hold { kInFlight, kWaited };
  Hold hold = Hold::kInFlight;
  // The longest a reduction partition is held back for urgent work (see contract item 4).
  absl::Duration max_hold = absl::Milliseconds(100);
  absl::Duration timeout = absl::Seconds(300);  // Create's check; the destructor's wait
  Timeline* timeline = nullptr;                 // optional, not owned
  MemoryStats* memory = nullptr;                // optional, not owned: the staging blocks
};

// One reduction as a submitter would launch it on its group (NCCL's count terms: all-reduce:
// elements of the buffer; reduce-scatter: recvcount, with send holding size() x count).
struct ReductionRequest {
  Group* group = nullptr;
  CollectiveKind kind = CollectiveKind::kAllReduce;  // kAllReduce or kReduceScatter
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DType dtype = DType::kF32;
  ReduceOp op;
  CollectiveOptions options;  // device groups only use the events (launched at once)
  int bucket = 0;             // timeline and Work info
};

class OpScheduler {
 public:
  // Collective over `verify` when given (every rank must pass the same config values; else
  // FailedPrecondition naming the ranks' values). InvalidArgument for a non-positive max_hold.
  static absl::StatusOr<std::unique_ptr<OpScheduler>> Create(const OpSchedulerConfig& config,
                                                             Group* verify = nullptr);
  ~OpScheduler();
  OpScheduler(const OpScheduler&) = delete;
  OpScheduler& operator=(const OpScheduler&) = delete;

  const OpSchedulerConfig& config() const { return config_; }

  // Queues `r` behind the group's earlier reductions; the returned Work completes once every
  // partition completed (first error). Bad arguments: an error now, nothing queued. A
  // partition whose launch fails fails the Work; the reduction's later partitions are skipped.
  absl::StatusOr<WorkPtr> SubmitReduction(const ReductionRequest& r);
  // Reports an urgent operation the caller launched itself (on a group of its own): until `w`
  // completes, reduction partitions not yet issued wait (priorities on; max_hold bounds it).
  void TrackUrgent(const WorkPtr& w, int64_t arg = -1);

  // While alive, the calling thread waits for an urgent operation (Hold::kWaited). A null
  // scheduler is allowed (no effect).
  class WaitScope {
   public:
    explicit WaitScope(OpScheduler* s);
    ~WaitScope();
    WaitScope(const WaitScope&) = delete;
    WaitScope& operator=(const WaitScope&) = delete;

   private:
    OpScheduler* const s_;
  };

  // Counters (monotonic): partitions issued, reductions submitted, partitions held back for
  // urgent work at least once, holds ended by max_hold.
  int64_t partitions_issued() const;
  int64_t reductions_submitted() const;
  int64_t holds() const;
  int64_t hold_expiries() const;

 private:
  struct Pending;
  struct Lane;
  struct Outbox;
  struct Issued {  // a partition launched under mu_, watched after mu_ is released
    WorkPtr work;  // null in a deferred entry: an urgent operation completed
    std::shared_ptr<Pending> pending;
    Lane* lane = nullptr;
    int part = 0;
    int staging = -1;  // the lane's staging block it reads, or -1
    size_t bytes = 0;
    int64_t start_ns = 0;
    absl::Status status;  // deferred entries: the completion status
  };

  explicit OpScheduler(const OpSchedulerConfig& config);
  Lane& LaneLocked(Group* g);
  // With mu_ held: issues, lane by lane, what the credit and priorities allow.
  void PumpLocked(Outbox* out);
  void PumpLaneLocked(Lane& lane, Outbox* out);
  // With mu_ held, once the last partition of a device reduction was launched.
  void ArmDeviceCompletionLocked(Pending& p);
  // With mu_ held: launches partition `part` of `p` (packed into staging block `slot` when >= 0).
  absl::StatusOr<Issued> LaunchPartLocked(Lane& lane, const std::shared_ptr<Pending>& p, int part,
                                          int slot);
  // Without mu_: watches what was issued, completes what finished.
  void Deliver(Outbox* out);
  void OnPartDone(const Issued& is, const absl::Status& st);
  void OnUrgentDone();
  bool UrgentActiveLocked() const;  // whether urgent work holds reductions now
  void EndWait();
  // The scheduler's thread: completions handed over by tls (see the .cc), and max_hold.
  void HelperLoop();

  const OpSchedulerConfig config_;
  Timeline* tl_ = nullptr;
  int tl_urgent_ = 0;
  WorkPool works_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // the hold timer; in-flight drain at destruction
  std::vector<std::unique_ptr<Lane>> lanes_;
  int urgent_in_flight_ = 0;
  int waiting_ = 0;            // WaitScopes alive
  bool holding_ = false;       // a partition is held back for urgent work
  absl::Time hold_since_;      // when the current hold began
  bool hold_expired_ = false;  // max_hold passed: release until urgent work drains
  bool stopping_ = false;
  std::deque<Issued> deferred_;  // completions for the helper thread
  std::vector<std::pair<WorkPtr, absl::Status>> deferred_complete_;  // reductions it completes
  int64_t partitions_issued_ = 0, submitted_ = 0, holds_ = 0, hold_expiries_ = 0;
  std::thread timer_;  // last: starts after everything it uses
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_OP_SCHEDULER_H_
