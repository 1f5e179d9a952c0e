// UnitScheduler: fully sharded parameters (ZeRO-3 / FSDP) unit by unit on top of a
// ParamGatherer with fully_sharded. A unit (ParamSpec::unit, e.g. one transformer block) is the
// set of buckets BucketPlan::UnitBuckets(u); the scheduler gathers a unit's buckets before the
// unit is used, releases them after, and prefetches the next units of a schedule recorded on
// the first step, under a limit on gathered-but-not-released bytes.
//
//   ASSIGN_OR_RETURN(auto units, UnitScheduler::Create(gatherer.get(), UnitConfig{}));
//   for each step:
//     for u in the model's forward:  units->BeginForward(u); ...run u...; units->EndForward(u);
//     for u in the backward:         units->BeginBackward(u); ...;        units->EndBackward(u);
//     units->EndStep();   // the first one is collective: every rank recorded the same order
//
// Schedule. The first step (until the first EndStep) is the recording step: every gather is
// required and happens when its unit is entered, nothing is prefetched, and the forward order is
// recorded: the units whose BeginForward had to gather them, in call order (a unit entered again
// while still gathered is not recorded again). The first EndStep is collective over the
// gatherer's group: one small all-gather (length, hash and the first 16 units of every rank's
// order, and how many units each rank still holds) verifies that every rank recorded the same
// order (FailedPrecondition naming each rank and its order otherwise). From then on each step
// has a forward schedule (the recorded order) and a backward schedule (its reverse). Later
// EndSteps are local.
//
// RANK-ORDER CONTRACT (why every rank issues the same all-gathers in the same order). Ranks
// match the gatherer's all-gathers by position, so every rank must launch the same buckets in
// the same sequence.
//  1. Every launch goes through one place, under one mutex: the decision which units to launch
//     next and the reservation of their launch turn (a ticket) happen in one critical section,
//     and tickets are executed strictly in ticket order (the mutex is dropped only while a
//     ticket runs before_gather and ParamGatherer::Prefetch, and the next ticket waits for it).
//     So the global launch sequence equals the decision sequence, whichever thread decided
//     (BeginX on the training thread, or a deferred prefetch retried from EndBackward on an
//     autograd thread).
//  2. After recording, a decision only ever launches the next not-yet-launched position of the
//     current phase's schedule (forward: recorded order; backward: its reverse). A required
//     gather (BeginX of a unit that is not gathered) must be that very position: BeginX of any
//     other not-gathered unit is FailedPrecondition naming the expected and the actual unit, and
//     launches nothing. A prefetch is only an earlier launch of that same position. The limit
//     and the prefetch depth decide WHEN a position is launched, never WHETHER or in which
//     order, so timing differences between ranks (deferred prefetches, threads) cannot reorder
//     launches.
//  3. A position whose unit is already gathered (or being gathered) when the launch cursor
//     reaches it, or whose unit was already entered in this phase, is skipped, not launched.
//     BeginX of an already gathered unit out of order is OK and does not move the cursor. The
//     skip decision is identical on every rank when the unit's liveness at that moment is:
//     this holds for units kept from the forward into the backward (no EndForward, or
//     reshard_after_forward = false; these are released only by their own EndBackward, which
//     follows their BeginBackward, which makes their position skipped), and generally whenever
//     each unit occurs once per schedule. A unit that occurs twice in the recorded order (gathered,
//     released and gathered again in one forward) additionally needs its release to happen in
//     the same order relative to the other calls on every rank (e.g. EndX on the calling thread).
//  4. Recording step: gathers happen in call order, identical on every rank because every rank
//     makes the same calls in the same order; EndStep verifies the recorded orders.
//  5. GatherAll launches every bucket in bucket order (outside a step, where nothing is live).
// The group must see no other all-gathers interleaved from elsewhere (give the gatherer its own
// group, as ParamGatherer says).
//
// Limit. live_bytes() is the sum of Bucket::bytes() of every unit launched and not released.
// A prefetch that would take live_bytes() above max_live_bytes is deferred and retried, still
// in schedule order, at the next BeginX / EndX call; a required gather (the unit being entered)
// is never held back. Hence peak_live_bytes() <= max_live_bytes holds when (a) max_live_bytes
// >= 2 x the largest unit's bytes and (b) every unit is released before the unit after the next
// one is entered (at most the previous unit is live when the entered unit's required gather
// runs), with no units kept across (GatherAll, reshard_after_forward = false, roots kept into
// the backward). Otherwise only prefetches respect it. Actual gather memory (MemoryStats
// kParamGather) is held buffers plus the gatherer's pool of free buffers (see
// ParamGatherer::pooled_bytes()); a held buffer may be up to 2x its bucket (best-fit reuse).
//
// Release. EndForward (when reshard_after_forward) and EndBackward release every bucket of the
// unit (ParamGatherer::Release; a gather still in flight is waited for first, with the mutex
// held). With reshard_after_forward = false a unit stays gathered from its forward until its
// EndBackward. EndBackward may be called from any thread.
//
// EndStep: FailedPrecondition naming the units still entered or gathered (for the first, on
// every rank, after the collective check). GatherAll / ReleaseAll: outside a step (no unit
// entered or gathered), GatherAll gathers every bucket in bucket order and keeps it ("summon
// full params"); ReleaseAll releases them. BeginForward / BeginBackward in between:
// FailedPrecondition.
//
// Errors. A launch that fails (before_gather or the gatherer) leaves the schedule position
// consumed on this rank only, so the ranks' collective sequences may differ from then on: the
// scheduler keeps that error and returns it from every later call that could launch.
//
// Threading: every method may be called from any thread; the accessors are lock-free.
#ifndef BRAID_SCHEDULER_UNIT_SCHEDULER_H_
#define BRAID_SCHEDULER_UNIT_SCHEDULER_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/tensor.h"
#include "scheduler/memory_stats.h"
#include "scheduler/param_gatherer.h"
#include "scheduler/timeline.h"

namespace braid::sched {

struct UnitConfig {
  size_t max_live_bytes = 0;  // 0: 2 x the largest unit's bytes
  int prefetch = 1;           // units ahead (0: none)
  bool reshard_after_forward =
      true;  // false: a unit stays gathered from its forward until EndBackward
  // Bounds waits for a launch running on another thread (BeginX of a unit being launched there,
  // EndStep): DeadlineExceeded. Gathers themselves wait up to the gatherer's own timeout.
  absl::Duration timeout = absl::Seconds(300);
  Timeline* timeline = nullptr;  // optional: "gather unit" / "release unit" instants on "units"
  // Optional. The scheduler allocates no memory of its own (the gatherer counts its buffers into
  // its own GathererConfig::memory); accepted for symmetry with the other components.
  MemoryStats* memory = nullptr;
  // Called before each bucket's gather is launched in a FORWARD phase (and by GatherAll), so a
  // producer of the shard (the sharded optimizer's step) is waited for; *ready gets an event the
  // gather waits on (device). Not called for backward gathers (the shards do not change during
  // a backward). Called WITHOUT the scheduler's mutex held, from whichever thread launches (the
  // launch turn is held, so later launches wait for it); it may call the const accessors, not
  // Begin/End/EndStep/GatherAll/ReleaseAll (those would wait for its own launch turn). An error
  // fails the launch (see Errors).
  std::function<absl::Status(int bucket, DeviceEvent* ready)> before_gather;
};

class UnitScheduler {
 public:
  // gatherer must have fully_sharded = true; InvalidArgument otherwise, or for a limit below
  // the largest unit's bytes (naming both). Not owned; must outlive the scheduler.
  static absl::StatusOr<std::unique_ptr<UnitScheduler>> Create(ParamGatherer* gatherer,
                                                               const UnitConfig& config);
  ~UnitScheduler();
  UnitScheduler(const UnitScheduler&) = delete;
  UnitScheduler& operator=(const UnitScheduler&) = delete;

  // Unknown unit / unit with no bucket: InvalidArgument naming it. After recording, a unit that
  // is neither gathered nor the next of the schedule: FailedPrecondition naming both.
  absl::Status BeginForward(
      int unit);                      // gather (launch what is not in flight), prefetch ahead, wait
  absl::Status EndForward(int unit);  // release (unless !reshard_after_forward)
  absl::Status BeginBackward(int unit);  // gather, prefetch the next units in backward order, wait
  absl::Status EndBackward(int unit);    // release; any thread
  absl::Status EndStep();                // see above
  absl::Status GatherAll();   // outside a step: gather every bucket in bucket order and keep it
  absl::Status ReleaseAll();  // release everything GatherAll gathered (OK when nothing) and
                              // free the gatherer's pool of buffers (TrimPool)

  int64_t live_bytes() const { return live_.load(); }  // launched-not-released Bucket::bytes()
  int64_t peak_live_bytes() const { return peak_.load(); }
  int64_t gathers_issued() const { return issued_.load(); }  // unit gathers launched (1 per unit)
  const std::vector<int>& forward_order() const;  // recorded in the first step (stable after it)

 private:
  enum class UnitState { kReleased, kLaunching, kLaunched, kGathered };
  enum class Phase { kIdle, kForward, kBackward };
  struct Unit {
    std::vector<int> buckets;
    int64_t bytes = 0;
    UnitState state = UnitState::kReleased;
    int fwd_active = 0, bwd_active = 0;  // entered, not ended
    int entered_in_phase = 0;            // BeginX calls of the current phase
  };

  UnitScheduler(ParamGatherer* gatherer, const UnitConfig& config, std::vector<Unit> units,
                int64_t limit);

  absl::Status Begin(int unit, bool forward);
  absl::Status End(int unit, bool forward);
  absl::Status CheckUnit(const char* what, int unit) const;
  // With mu_ held (lock): position skipping, prefetch decisions (and the required `unit`, or
  // -1), then the launch of everything decided, in ticket order. Drops and retakes the lock.
  absl::Status DecideAndLaunchLocked(std::unique_lock<std::mutex>& lock, int required);
  // With mu_ held: marks `units` launching, reserves a ticket and runs it (drops the lock).
  absl::Status LaunchLocked(std::unique_lock<std::mutex>& lock, const std::vector<int>& units,
                            bool call_before_gather);
  // With mu_ held: whether schedule position p needs no launch (see contract item 3).
  bool SkippableLocked(size_t p) const;
  // With mu_ held: releases unit u (waits for a gather still in flight).
  absl::Status ReleaseLocked(int u);
  void AddLive(int64_t bytes);
  void StartPhaseLocked(Phase phase);

  ParamGatherer* const gatherer_;
  const UnitConfig config_;
  const int64_t limit_;
  Timeline* tl_ = nullptr;
  int tl_row_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // launch turns and launching -> launched
  std::vector<Unit> units_;
  bool recording_ = true;
  std::vector<int> order_;  // the recorded forward order
  Phase phase_ = Phase::kIdle;
  std::vector<int> sched_;       // current phase's schedule (after recording)
  std::vector<int> occurrence_;  // occurrence_[p]: earlier positions of sched_[p]'s unit
  std::vector<bool> skipped_;    // positions the launch cursor skipped
  size_t launch_pos_ = 0;        // next schedule position not yet launched / skipped
  bool gathered_all_ = false;
  uint64_t next_ticket_ = 0, serving_ticket_ = 0;
  absl::Status broken_;  // sticky launch error

  std::atomic<int64_t> live_{0}, peak_{0}, issued_{0};
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_UNIT_SCHEDULER_H_
