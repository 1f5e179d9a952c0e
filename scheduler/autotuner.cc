#include "scheduler/autotuner.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "comm/host_values.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::sched {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k % 2 == 1 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
}

int64_t ConfigHash(const AutotunerConfig& c) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(c.candidates.size());
  for (const TuneCandidate& t : c.candidates) {
    mix(t.bucket_cap_bytes);
    mix(t.credit_bytes);
  }
  mix(static_cast<uint64_t>(c.steps_per_trial));
  mix(static_cast<uint64_t>(c.min_gain * 1e6));
  return static_cast<int64_t>(h >> 1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Autotuner>> Autotuner::Create(Group* group,
                                                             const AutotunerConfig& config) {
  if (group == nullptr) return absl::InvalidArgumentError("Autotuner: no group");
  if (config.candidates.empty() || config.candidates.size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("Autotuner: 1 to 64 candidates, got ", config.candidates.size()));
  }
  if (config.steps_per_trial < 1)
    return absl::InvalidArgumentError("Autotuner: steps_per_trial must be >= 1");
  if (!(config.min_gain >= 0 && config.min_gain < 1)) {
    return absl::InvalidArgumentError("Autotuner: min_gain must be in [0, 1)");
  }
  for (size_t i = 0; i < config.candidates.size(); ++i) {
    if (config.candidates[i].bucket_cap_bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Autotuner: candidate ", i, " has a zero bucket cap"));
    }
  }
  // Every rank the same candidates and settings (each group's ranks compare with its rank 0).
  for (Group* g : {group, config.replica}) {
    if (g == nullptr || g->size() == 1) continue;
    const int64_t mine = ConfigHash(config);
    std::vector<int64_t> all(g->size());
    RETURN_IF_ERROR(AllGatherHostValues(*g, &mine, all.data(), 1, DType::kI64,
                                        "autotuner config check", absl::Now() + config.timeout));
    for (int r = 1; r < g->size(); ++r) {
      if (all[r] != all[0]) {
        return absl::FailedPreconditionError(
            absl::StrCat("Autotuner on group '", g->name(), "': rank ", r,
                         " has other candidates or settings than rank 0"));
      }
    }
  }
  return std::unique_ptr<Autotuner>(new Autotuner(group, config));
}

Autotuner::Autotuner(Group* group, const AutotunerConfig& config) : group_(group), config_(config) {
  if (config_.timeline != nullptr && config_.timeline->enabled()) {
    tl_ = config_.timeline;
    tl_row_ = tl_->Track("autotune");
  }
  alive_.resize(config_.candidates.size());
  std::iota(alive_.begin(), alive_.end(), 0);
  samples_ms_.assign(alive_.size(), {});
  done_ = alive_.size() == 1;
}

absl::StatusOr<bool> Autotuner::EndStep(absl::Duration step_time) {
  if (done_) return false;
  // Round-robin: step k of the round ran alive_[k % n]; its first pass is the warm-up.
  const size_t n = alive_.size();
  const size_t slot = step_in_round_ % n;
  if (step_in_round_ >= n) samples_ms_[slot].push_back(absl::ToDoubleMilliseconds(step_time));
  ++step_in_round_;
  const int before = current_;
  if (step_in_round_ < n * static_cast<size_t>(1 + (config_.steps_per_trial << round_))) {
    current_ = alive_[step_in_round_ % n];
  } else {
    RETURN_IF_ERROR(EndRound());
  }
  return current_ != before;
}

absl::Status Autotuner::EndRound() {
  // The slowest rank's figure, identical on every rank.
  std::vector<double> ms;
  for (const std::vector<double>& v : samples_ms_) ms.push_back(Median(v));
  for (Group* g : {group_, config_.replica}) {
    if (g != nullptr && g->size() > 1) {
      RETURN_IF_ERROR(AllReduceHostValues(*g, ms.data(), ms.size(), DType::kF64, ReduceOp::Max(),
                                          "autotuner round", absl::Now() + config_.timeout));
    }
  }
  const size_t first = trials_.size();
  for (size_t i = 0; i < alive_.size(); ++i) {
    trials_.push_back(Trial{alive_[i], round_, config_.steps_per_trial << round_, ms[i], false});
    if (tl_ != nullptr) {
      tl_->Instant(tl_row_, "trial", alive_[i]);
      tl_->Counter(tl_row_, "trial us", static_cast<int64_t>(ms[i] * 1000));
    }
  }
  std::vector<size_t> order(alive_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms[a] < ms[b]; });
  std::vector<int> next;
  for (size_t k = 0; k < (alive_.size() + 1) / 2; ++k) {
    next.push_back(alive_[order[k]]);
    trials_[first + order[k]].survived = true;
  }
  std::sort(next.begin(), next.end());
  auto start_round = [&](std::vector<int> candidates) {
    alive_ = std::move(candidates);
    step_in_round_ = 0;
    samples_ms_.assign(alive_.size(), {});
    ++round_;
    current_ = alive_[0];
  };
  if (next.size() > 1) {
    start_round(std::move(next));
    return absl::OkStatus();
  }
  // One left. Unless the default ran in this round, one more round runs the two of them
  // (the confirmation); the survivor is adopted only if it beat the default by min_gain in
  // the last round, which both ran.
  int winner = next[0];
  const bool default_ran = std::find(alive_.begin(), alive_.end(), 0) != alive_.end();
  if (winner != 0 && !default_ran) {
    start_round({0, winner});
    return absl::OkStatus();
  }
  if (winner != 0) {
    double t0 = 0, tw = 0;
    for (size_t i = 0; i < alive_.size(); ++i) {
      if (alive_[i] == 0) t0 = ms[i];
      if (alive_[i] == winner) tw = ms[i];
    }
    if (tw > t0 * (1 - config_.min_gain)) winner = 0;
  }
  current_ = winner;
  done_ = true;
  if (tl_ != nullptr) tl_->Instant(tl_row_, "adopt", winner);
  Log().info("autotuner on group '{}':\n{}", group_->name(), Table());
  return absl::OkStatus();
}

std::string Autotuner::Table() const {
  std::vector<std::string> lines;
  lines.push_back("round candidate bucket_cap_bytes credit_bytes steps median_ms survived");
  for (const Trial& t : trials_) {
    const TuneCandidate& c = config_.candidates[t.candidate];
    lines.push_back(absl::StrCat(
        t.round, " ", t.candidate, " ", c.bucket_cap_bytes, " ", c.credit_bytes, " ", t.steps, " ",
        absl::StrFormat("%.3f", t.median_ms), " ", t.survived ? "yes" : "no"));
  }
  if (done_) {
    const TuneCandidate& c = config_.candidates[current_];
    lines.push_back(absl::StrCat("adopted: candidate ", current_, " (bucket cap ",
                                 c.bucket_cap_bytes, " B, credit ", c.credit_bytes, " B)",
                                 current_ == 0 ? ", the default" : ""));
  }
  return absl::StrJoin(lines, "\n");
}

}  // namespace braid::sched
