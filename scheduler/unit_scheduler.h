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
// Contract:
//  - The first step records the forward order (nothing prefetched); its EndStep verifies that
//    every rank recorded the same order (FailedPrecondition naming each rank's otherwise). Later
//    steps follow the recorded order forward and its reverse backward.
//  - Rank order: every launch is decided and ticketed under one mutex; a launch is always the
//    next position of the current schedule (a required gather of any other unit is an error
//    naming the expected and the actual unit); the limit and the prefetch depth decide only WHEN.
//  - Limit: a prefetch that would take live_bytes() above max_live_bytes waits, and so does
//    one for which a bounded buffer pool shared with the gradients has no room
//    (ParamGatherer::PoolFits); a required gather never does (it may wait inside the pool).
//    peak_live_bytes() <= max_live_bytes when it is >= 2x the largest unit and units are released
//    in order.
//  - EndForward (reshard_after_forward) and EndBackward release the unit's buckets. EndStep
//    names units still entered or gathered. GatherAll / ReleaseAll only outside a step.
//  - A failed launch is kept and returned from every later call that could launch (the ranks'
//    sequences may differ from then on). Any thread may call.
// The schedule, the rank-order argument and the limit in full: docs/design/scheduler.md.
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
  // Outside a step: gather every bucket in bucket order and keep it; exact values even with
  // GathererConfig::quant (summoned parameters and checkpoints are never quantized).
  absl::Status GatherAll();
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
  bool PoolFitsLocked(int u) const;  // the gatherer's shared pool has room for unit u's buckets
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
