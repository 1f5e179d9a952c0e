// OpScheduler: one rank's launch queue between the reducer / gatherer and the backend. It splits
// large reductions into credit-sized partitions (scheduler/partition.h), keeps at most a credit
// of reduction bytes in flight per group, and lets urgent operations (the parameter gathers the
// model waits for next) go ahead of reductions whose results are needed only at the optimizer
// step.
//
//   OpSchedulerConfig sc;
//   sc.credit_bytes = 4 << 20;  // partitions of at most 4 MiB, 4 MiB in flight per group
//   sc.priorities = true;       // gathers in flight hold back further reduction partitions
//   ASSIGN_OR_RETURN(auto ops, OpScheduler::Create(sc, world.get()));  // collective: checks sc
//   ReducerConfig rc;  rc.scheduler = ops.get();    // reductions go through it
//   GathererConfig gc; gc.scheduler = ops.get();    // gathers are reported as urgent
//
// Priorities (lower runs first): 0 urgent (a gather the model waits for before its next forward
// or backward), 1 reduction (needed at the step). Reductions run among themselves in the order
// they were submitted (bucket order, each bucket's partitions in increasing order).
//
// RANK-ORDER CONTRACT (why every rank still issues each group's collectives in the same order):
//  1. Per group, the scheduler issues reduction partitions strictly in submission order (one
//     FIFO per group; the head partition is issued or nothing is). Every submitter already
//     submits in a rank-consistent order: the reducer from its bucket-index launch cursor
//     under its mutex (gradient_reducer.h), the hybrid replica stage from its own cursor.
//  2. The partitions of a reduction are computed from plan data only (count, dtype, the group's
//     size, credit_bytes), so every rank splits a bucket identically; Create verifies, with one
//     small all-gather, that every rank has the same credit_bytes and priorities.
//  3. Credit, priority and the hold limit decide only WHEN the head of a group's FIFO is issued,
//     never which operation is next on that group, so local timing cannot reorder a group's
//     sequence. Urgent operations run on other groups (the gatherer has a group of its own, see
//     param_gatherer.h), so holding reductions back never interleaves anything into a
//     reduction group's sequence either.
//  4. No wait cycle: reductions wait for urgent operations, urgent operations never wait for
//     the scheduler. A framework that makes a gather depend on a held reduction (e.g. a gather
//     issued only after a peer's later reduction completed) is still safe: a reduction is held
//     at most max_hold, after which the queue is released as if no urgent work were in flight.
// Nothing here reads a clock to choose an order; the clock only ends a hold (a WHEN).
//
// Partitions. A submitted reduction becomes SplitReduction(count, esize, ranks, credit_bytes)
// collectives on its group; its Work completes (with the first error) once every partition
// completed. All-reduce partition k reduces elements [lo, hi) of the buffer in place (or
// send -> recv at the same offsets). Reduce-scatter partition k packs slice [lo, hi) of every
// rank's region of `send` into a contiguous staging block (the scheduler's, at most two of
// credit_bytes per group, counted as MemoryUse::kStaging) and reduce-scatters it into
// recv[lo, hi). Results are bit-identical to the unpartitioned call on backends whose
// per-element combination order does not depend on the call's size (see partition.h): `local`
// always, `mpi` at 2 ranks (tested), not promised for MPI's own algorithms at more ranks.
// A reduction of a single partition is launched exactly as submitted (no staging).
// Device groups (buffer_ops() not synchronous, nccl) are partitioned and held the same way, on
// the host side of the stream: partitions are launched onto the group's comm stream as credit
// and priorities allow (from the completion thread of the previous ones), the stream waits on
// the request's readiness events before partition 0 (its packing copies included), staging
// blocks are device memory filled by stream copies, and the returned Work completes through
// BufferOps::CompleteAfter after the last partition, so its device_event() marks the end of
// the whole reduction for consumer streams (a failed partition completes it first, with its
// error). Bit-exactness there is NCCL's: its per-element order may depend on the call size at
// more than 2 ranks (tested bit for bit on the fake device, which adds in rank order).
//
// Credit. On a group, a partition is issued when nothing of that group is in flight, or when
// the bytes in flight plus its own stay within credit_bytes. credit_bytes == 0: no partitions
// and no credit limit (reductions are issued as submitted, subject to priorities).
//
// Timeline (config.timeline): per group a row "sched <group>" with one span per partition,
// named "<allreduce|reduce_scatter> partition [prio 1]", arg = bucket * 1000 + partition
// index, from its issue to its completion; an instant "held [prio 1 behind prio 0]" when a
// partition is held back for an urgent operation; a row "sched urgent" with a span
// "gather [prio 0]" (arg: the caller's, e.g. the bucket) per urgent operation.
//
// Threading: every method may be called from any thread. Completion callbacks of the backend
// issue the next partitions (they must not block: the scheduler issues under its own mutex and
// never waits in a callback). Lifetime: must outlive every reducer and gatherer using it; the
// destructor fails reductions never issued (Cancelled) and waits (up to config.timeout) for
// those in flight.
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
