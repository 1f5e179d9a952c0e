// BucketTuner: the autotuner's policy (Horovod's autotuning of its fusion buffer, by successive
// halving instead of Bayesian optimization). Pure computation: it is fed one step time per step
// and answers which bucket cap the next step should run with; it never communicates.
//
//   BucketTuner tuner(TunerConfig{}, /*default_cap=*/25 << 20, /*default_first_cap=*/1 << 20);
//   every step, at the same point on every rank:
//     double agreed = max over ranks of this rank's step time;   // see "Rank consistency"
//     TunerDecision d = tuner.Observe(agreed);
//     if (d.switch_to) reducer->Replan(d.switch_to->bucket_cap, d.switch_to->first_cap);
//
// Search. Candidates are the default caps and the default bucket cap scaled by each factor
// (first cap: min(default first cap, bucket cap)), in that order, duplicates dropped. After
// `warmup_steps` steps on the default, every candidate runs `steps_per_trial` measured steps
// (the first step after each switch is discarded: it pays for the re-plan). A round keeps the
// better half by median step time (ties: the earlier candidate), and the survivors run another
// trial each, their samples pooled, until one is left. The winner is adopted only when its
// median beats the default's median (measured in the same run) by more than `min_gain`;
// otherwise the default stays. After adoption a confirmation trial runs the winner again: if
// its median is not below the default's, the tuner goes back to the default. So the tuned job
// ends on a configuration whose measured step time is no worse than the default's.
//
// Rank consistency. Ranks must re-plan at the same step with the same caps (the re-plan is
// collective). The tuner's answer depends only on the sequence of step times it is fed, so
// feeding every rank the same sequence (an all-reduce max of each rank's time, as
// braid_reducer_autotune does) makes every rank take the same decisions at the same steps.
//
// The table: every finished trial is recorded (candidate, round, median seconds, samples) and
// returned by table(); done() once the tuner settled; result() is the adopted candidate.
#ifndef BRAID_SCHEDULER_BUCKET_TUNER_H_
#define BRAID_SCHEDULER_BUCKET_TUNER_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace braid::sched {

struct TunerConfig {
  int warmup_steps = 2;      // steps on the default before any trial (plan rebuilds, caches)
  int steps_per_trial = 3;   // measured steps per candidate per round (after one discarded)
  // Bucket caps tried, as factors of the default bucket cap.
  std::vector<double> cap_factors = {0.125, 0.25, 0.5, 2.0};
  double min_gain = 0.03;    // a winner must be this much faster than the default (fraction)
};

struct TunerCandidate {
  size_t bucket_cap = 0;
  size_t first_cap = 0;
  bool operator==(const TunerCandidate& o) const {
    return bucket_cap == o.bucket_cap && first_cap == o.first_cap;
  }
};

struct TunerTrial {
  int candidate = 0;      // index into candidates()
  int round = 0;          // 0, 1, ...; confirmation trials have round -1
  double median_s = 0;    // over the candidate's pooled samples so far
  int samples = 0;
};

struct TunerDecision {
  // Set when the next step must run on other caps (re-plan before it).
  std::optional<TunerCandidate> switch_to;
};

class BucketTuner {
 public:
  BucketTuner(TunerConfig config, size_t default_cap, size_t default_first_cap);

  // One step's (agreed) time in seconds; the decision for the next step. After done(), always
  // no switch. A non-finite or negative time is treated as +infinity (that trial loses).
  TunerDecision Observe(double step_seconds);

  bool done() const { return phase_ == Phase::kDone; }
  const std::vector<TunerCandidate>& candidates() const { return candidates_; }
  const std::vector<TunerTrial>& table() const { return table_; }
  // The candidate in use now (the adopted one once done()).
  const TunerCandidate& current() const { return candidates_[current_]; }
  int current_index() const { return current_; }
  // "cap 3.1 MiB (first 1.0 MiB): round 0 median 12.3 ms over 3 steps" lines, one per trial.
  std::string TableText() const;

 private:
  enum class Phase { kWarmup, kSearch, kConfirm, kDone };

  double Median(int candidate) const;
  TunerDecision SwitchTo(int candidate);
  void StartRound();
  TunerDecision NextTrial();

  TunerConfig config_;
  std::vector<TunerCandidate> candidates_;
  std::vector<std::vector<double>> samples_;  // per candidate, pooled over its trials
  std::vector<TunerTrial> table_;
  Phase phase_ = Phase::kWarmup;
  int current_ = 0;          // candidate running now
  int step_in_trial_ = 0;    // steps observed in the current trial (incl. the discarded one)
  int warmup_left_ = 0;
  int round_ = 0;
  std::vector<int> alive_;   // candidates of the current round
  size_t next_in_round_ = 0; // index into alive_ of the trial running
  bool discard_next_ = false;
  std::vector<double> confirm_;  // the confirmation trial's samples
  int winner_ = 0;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_BUCKET_TUNER_H_
