// Autotuner: picks a bucket cap and a credit size (scheduler/op_scheduler.h) for a job from a
// small list of candidates, by timing its first real steps, and agrees on the winner across
// ranks. Off unless the framework creates one (one option); the default configuration is always
// a candidate and wins unless another beats it by min_gain, so tuning never adopts a
// configuration measured slower than the default.
//
//   AutotunerConfig ac;
//   ac.candidates = {{25 << 20, 0}, {25 << 20, 4 << 20}, {12 << 20, 4 << 20}, {50 << 20, 1 << 20}};
//   ASSIGN_OR_RETURN(auto tuner, Autotuner::Create(world.get(), ac));   // collective
//   for each step:
//     ... run the step with tuner->current().bucket_cap_bytes / credit_bytes ...
//     ASSIGN_OR_RETURN(bool replan, tuner->EndStep(step_time));         // collective at round ends
//     if (replan) ... rebuild the reducer (and scheduler) for tuner->current(), at this boundary
//     ...
//
// Search: successive halving. Round r runs the surviving candidates round-robin, one step each
// in turn (so drift in the machine's load hits them alike; the caller re-plans between steps,
// cheaply if it keeps each candidate's reducer), for 1 + (steps_per_trial << r) passes; the
// first pass is a warm-up and is not timed; a trial's figure is the median of its timed steps. At
// the end of a round one small all-reduce (max over ranks, i.e. the slowest rank's median: a step
// is as slow as its slowest rank) gives every rank the same table; the faster half survives (ties:
// the earlier candidate). When one survives and the default did not run in that round, a
// confirmation round runs the default and the survivor again (twice the steps); the survivor is
// adopted only if it beat the default by min_gain in the final round, else the default is. The
// trial table is logged and recorded on the timeline (row "autotune": a counter "trial us" per
// trial, and an instant "adopt" whose arg is the winner's index).
//
// RANK-ORDER CONTRACT: which candidate runs at which step depends only on the step count, and
// every decision only on the all-reduced table, so every rank re-plans at the same step boundary
// to the same configuration (re-planning is collective: plan checks, scheduler checks). EndStep
// must be called at every step boundary on every rank (the all-reduce at each round's end is
// collective over `group`, which must carry no other traffic concurrently: give it its own, or
// call EndStep where nothing else is in flight on it). Local timing decides nothing by itself.
//
// Adopting: GradientReducer::Replan(cap, first_cap) at the step boundary (collective) rebuilds
// the buckets with the new cap and moves every gradient, a no_sync window's sums included, to
// its new slot; the framework fetches its gradient views again. What lives outside the reducer
// (parameters, a framework optimizer's state) is unaffected. A Braid ShardedOptimizer keyed by
// the bucket plan is not re-sharded (see docs/performance.md).
#ifndef BRAID_SCHEDULER_AUTOTUNER_H_
#define BRAID_SCHEDULER_AUTOTUNER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "scheduler/timeline.h"

namespace braid::sched {

struct TuneCandidate {
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t credit_bytes = 0;  // 0: no OpScheduler partitions
};

struct AutotunerConfig {
  std::vector<TuneCandidate> candidates;  // [0]: the default configuration; 1 to 64 entries
  int steps_per_trial = 2;                // timed steps per trial in round 0 (doubling per round)
  double min_gain = 0.03;                 // a winner must be this fraction faster than [0]
  absl::Duration timeout = absl::Seconds(300);
  Timeline* timeline = nullptr;  // optional, not owned
  // Optional, not owned: a second group the agreement also runs over (hybrid: the replica
  // group, so the slowest rank of the whole world decides). Host or device groups (the
  // all-reduces stage through the group's memory).
  Group* replica = nullptr;
};

class Autotuner {
 public:
  struct Trial {
    int candidate = 0;
    int round = 0;
    int steps = 0;         // timed steps
    double median_ms = 0;  // the slowest rank's median step time
    bool survived = false;
  };

  // Collective over `group` (not owned; outlives the tuner): verifies every rank has the same
  // candidates. InvalidArgument for an empty list, steps_per_trial < 1 or min_gain outside
  // [0, 1); FailedPrecondition naming the ranks when the lists differ.
  static absl::StatusOr<std::unique_ptr<Autotuner>> Create(Group* group,
                                                           const AutotunerConfig& config);

  const TuneCandidate& current() const { return config_.candidates[current_]; }
  int current_index() const { return current_; }
  bool done() const { return done_; }
  int winner() const { return done_ ? current_ : -1; }
  // Call at every step boundary with this rank's step time. Returns true when current()
  // changed (re-plan before the next step). Collective at the end of each round.
  absl::StatusOr<bool> EndStep(absl::Duration step_time);
  const std::vector<Trial>& trials() const { return trials_; }
  // The trial table as text: one line per trial, then the adopted candidate.
  std::string Table() const;

 private:
  Autotuner(Group* group, const AutotunerConfig& config);
  absl::Status EndRound();

  Group* const group_;
  const AutotunerConfig config_;
  Timeline* tl_ = nullptr;
  int tl_row_ = 0;
  std::vector<int> alive_;  // this round's candidates, in index order
  int round_ = 0;
  size_t step_in_round_ = 0;  // steps of this round so far (warm-up pass included)
  std::vector<std::vector<double>> samples_ms_;  // per alive_ entry: its timed steps this round
  std::vector<Trial> trials_;
  int current_ = 0;
  bool done_ = false;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_AUTOTUNER_H_
