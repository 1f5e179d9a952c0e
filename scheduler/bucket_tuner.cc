#include "scheduler/bucket_tuner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace braid::sched {
namespace {

double MedianOf(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::infinity();
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string MiB(size_t bytes) { return absl::StrFormat("%.2f MiB", bytes / 1048576.0); }

}  // namespace

BucketTuner::BucketTuner(TunerConfig config, size_t default_cap, size_t default_first_cap)
    : config_(std::move(config)) {
  config_.steps_per_trial = std::max(config_.steps_per_trial, 1);
  config_.warmup_steps = std::max(config_.warmup_steps, 0);
  candidates_.push_back({default_cap, default_first_cap});
  for (double f : config_.cap_factors) {
    if (!(f > 0) || !std::isfinite(f)) continue;
    const size_t cap = std::max<size_t>(1, static_cast<size_t>(std::llround(default_cap * f)));
    const TunerCandidate c{cap, std::min(default_first_cap, cap)};
    if (std::find(candidates_.begin(), candidates_.end(), c) == candidates_.end()) {
      candidates_.push_back(c);
    }
  }
  samples_.resize(candidates_.size());
  warmup_left_ = config_.warmup_steps;
  if (candidates_.size() == 1) phase_ = Phase::kDone;  // nothing to try
}

double BucketTuner::Median(int candidate) const { return MedianOf(samples_[candidate]); }

TunerDecision BucketTuner::SwitchTo(int candidate) {
  step_in_trial_ = 0;
  if (candidate == current_) return {};
  current_ = candidate;
  discard_next_ = true;
  return {candidates_[candidate]};
}

void BucketTuner::StartRound() {
  next_in_round_ = 0;
}

TunerDecision BucketTuner::NextTrial() { return SwitchTo(alive_[next_in_round_]); }

TunerDecision BucketTuner::Observe(double step_seconds) {
  if (phase_ == Phase::kDone) return {};
  if (!std::isfinite(step_seconds) || step_seconds < 0) {
    step_seconds = std::numeric_limits<double>::infinity();
  }
  if (phase_ == Phase::kWarmup) {
    if (warmup_left_ > 0 && --warmup_left_ > 0) return {};
    phase_ = Phase::kSearch;
    alive_.clear();
    for (int c = 0; c < static_cast<int>(candidates_.size()); ++c) alive_.push_back(c);
    StartRound();
    return NextTrial();  // the default: it runs already, nothing to discard
  }
  if (discard_next_) {  // that step paid for the re-plan
    discard_next_ = false;
    return {};
  }
  if (phase_ == Phase::kConfirm) {
    confirm_.push_back(step_seconds);
    if (static_cast<int>(confirm_.size()) < config_.steps_per_trial) return {};
    const double m = MedianOf(confirm_);
    table_.push_back({current_, -1, m, static_cast<int>(confirm_.size())});
    phase_ = Phase::kDone;
    if (m < Median(0)) return {};  // confirmed
    return SwitchTo(0);
  }
  samples_[current_].push_back(step_seconds);
  if (++step_in_trial_ < config_.steps_per_trial) return {};
  table_.push_back({current_, round_, Median(current_), static_cast<int>(samples_[current_].size())});
  if (++next_in_round_ < alive_.size()) return NextTrial();
  // The round is over: keep the better half (ties: the earlier candidate).
  std::stable_sort(alive_.begin(), alive_.end(),
                   [this](int a, int b) { return Median(a) < Median(b); });
  alive_.resize((alive_.size() + 1) / 2);
  if (alive_.size() > 1) {
    ++round_;
    std::sort(alive_.begin(), alive_.end());  // candidate order within a round
    StartRound();
    return NextTrial();
  }
  winner_ = alive_[0];
  if (winner_ != 0 && Median(winner_) < Median(0) * (1.0 - config_.min_gain)) {
    phase_ = Phase::kConfirm;
    confirm_.clear();
    return SwitchTo(winner_);
  }
  phase_ = Phase::kDone;
  return SwitchTo(0);
}

std::string BucketTuner::TableText() const {
  std::string out;
  for (const TunerTrial& t : table_) {
    const TunerCandidate& c = candidates_[t.candidate];
    absl::StrAppend(&out, "cap ", MiB(c.bucket_cap), " (first ", MiB(c.first_cap), "): ",
                    t.round < 0 ? std::string("confirmation") : absl::StrCat("round ", t.round),
                    absl::StrFormat(" median %.3f ms over %d steps", t.median_s * 1e3, t.samples),
                    "\n");
  }
  if (done()) {
    absl::StrAppend(&out, "adopted: cap ", MiB(current().bucket_cap), " (first ",
                    MiB(current().first_cap), ")", current_ == 0 ? " (the default)" : "", "\n");
  }
  return out;
}

}  // namespace braid::sched
