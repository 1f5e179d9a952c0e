#include "scheduler/unit_scheduler.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/status_macros.h"

namespace braid::sched {
namespace {

constexpr size_t kShownUnits = 16;  // units of each rank's order in the end-of-step check

// What a braid_unit_enter / braid_unit_exit call was doing, as its errors say it.
const char* Name(bool forward, bool begin) {
  if (forward) return begin ? "entering the forward of" : "leaving the forward of";
  return begin ? "entering the backward of" : "leaving the backward of";
}

uint64_t HashOrder(const std::vector<int>& order) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a
  for (int u : order) {
    for (int i = 0; i < 4; ++i) {
      h ^= (static_cast<uint32_t>(u) >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

std::string OrderString(const std::vector<int>& order) {
  return absl::StrCat("[", absl::StrJoin(order, ", "), "]");
}

}  // namespace

absl::StatusOr<std::unique_ptr<UnitScheduler>> UnitScheduler::Create(ParamGatherer* gatherer,
                                                                     const UnitConfig& config) {
  if (gatherer == nullptr) return absl::InvalidArgumentError("unit scheduler: no gatherer given");
  if (!gatherer->config().fully_sharded) {
    return absl::InvalidArgumentError(
        "unit scheduler: the gatherer must have fully_sharded = true (units are gathered and "
        "released)");
  }
  if (config.prefetch < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unit scheduler: prefetch = ", config.prefetch, " (must be >= 0)"));
  }
  const BucketPlan& plan = gatherer->plan();
  std::vector<Unit> units(plan.num_units());
  int largest = -1;
  for (int u = 0; u < plan.num_units(); ++u) {
    units[u].buckets = plan.UnitBuckets(u);
    for (int b : units[u].buckets)
      units[u].bytes += static_cast<int64_t>(plan.buckets()[b].bytes());
    if (largest < 0 || units[u].bytes > units[largest].bytes) largest = u;
  }
  const int64_t largest_bytes = largest < 0 ? 0 : units[largest].bytes;
  const int64_t limit =
      config.max_live_bytes != 0 ? static_cast<int64_t>(config.max_live_bytes) : 2 * largest_bytes;
  if (limit < largest_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("unit scheduler: max_live_bytes = ", limit, " is below the ", largest_bytes,
                     " bytes of unit ", largest, " (the largest unit; a unit is gathered whole)"));
  }
  return std::unique_ptr<UnitScheduler>(
      new UnitScheduler(gatherer, config, std::move(units), limit));
}

UnitScheduler::UnitScheduler(ParamGatherer* gatherer, const UnitConfig& config,
                             std::vector<Unit> units, int64_t limit)
    : gatherer_(gatherer), config_(config), limit_(limit), units_(std::move(units)) {
  if (config_.timeline != nullptr && config_.timeline->enabled()) {
    tl_ = config_.timeline;
    tl_row_ = tl_->Track("units");
  }
}

UnitScheduler::~UnitScheduler() {
  // Let a launch running on another thread finish before the members go.
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return serving_ticket_ == next_ticket_; });
}

const std::vector<int>& UnitScheduler::forward_order() const { return order_; }

absl::Status UnitScheduler::CheckUnit(const char* what, int unit) const {
  if (unit < 0 || unit >= static_cast<int>(units_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " unit ", unit, ": no such unit (the plan has ", units_.size(), " units)"));
  }
  if (units_[unit].buckets.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " unit ", unit, ": unit ", unit,
                                                   " has no bucket (no parameter names it)"));
  }
  return absl::OkStatus();
}

void UnitScheduler::AddLive(int64_t bytes) {
  const int64_t now = live_.fetch_add(bytes) + bytes;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
}

void UnitScheduler::StartPhaseLocked(Phase phase) {
  phase_ = phase;
  for (Unit& u : units_) u.entered_in_phase = 0;
  launch_pos_ = 0;
  sched_.clear();
  occurrence_.clear();
  skipped_.clear();
  if (recording_) return;
  sched_ = order_;
  if (phase == Phase::kBackward) std::reverse(sched_.begin(), sched_.end());
  std::vector<int> seen(units_.size(), 0);
  for (int u : sched_) occurrence_.push_back(seen[u]++);
  skipped_.assign(sched_.size(), false);
}

bool UnitScheduler::PoolFitsLocked(int u) const {
  for (int b : units_[u].buckets) {
    if (!gatherer_->PoolFits(b)) return false;
  }
  return true;
}

bool UnitScheduler::SkippableLocked(size_t p) const {
  const Unit& un = units_[sched_[p]];
  return un.state != UnitState::kReleased || un.entered_in_phase > occurrence_[p];
}

absl::Status UnitScheduler::LaunchLocked(std::unique_lock<std::mutex>& lock,
                                         const std::vector<int>& units, bool call_before_gather) {
  if (units.empty()) return absl::OkStatus();
  std::vector<int> buckets;
  for (int u : units) {
    Unit& un = units_[u];
    un.state = UnitState::kLaunching;
    AddLive(un.bytes);
    issued_.fetch_add(1);
    buckets.insert(buckets.end(), un.buckets.begin(), un.buckets.end());
  }
  if (gathered_all_) std::sort(buckets.begin(), buckets.end());  // GatherAll: bucket order
  const bool exact = gathered_all_;  // read under the lock (see the launch below)
  const uint64_t ticket = next_ticket_++;
  cv_.wait(lock, [&] { return serving_ticket_ == ticket; });
  lock.unlock();
  absl::Status st;
  if (tl_ != nullptr) {
    for (int u : units) tl_->Instant(tl_row_, "gather unit", u);
  }
  for (int b : buckets) {
    DeviceEvent ready;
    if (call_before_gather && config_.before_gather) {
      st = config_.before_gather(b, &ready);
      if (!st.ok()) {
        st = WithContext(st, absl::StrCat("before_gather(bucket ", b, ")"));
        break;
      }
    }
    // GatherAll (summoned parameters, checkpoints) moves exact values even with quantized
    // gathers; every rank's GatherAll is the same collective, so the ranks agree.
    st = gatherer_->Prefetch(b, ready, exact);
    if (!st.ok()) break;
  }
  lock.lock();
  // On failure the units stay live (their released buckets release as a no-op); the error is
  // kept, since the ranks' collective sequences may differ from here on.
  for (int u : units) units_[u].state = UnitState::kLaunched;
  if (!st.ok() && broken_.ok()) {
    broken_ = WithContext(st,
                          "unit scheduler: a gather failed to launch (the ranks' gather "
                          "sequences may differ from here on)");
  }
  ++serving_ticket_;
  cv_.notify_all();
  return st.ok() ? st : broken_;
}

absl::Status UnitScheduler::DecideAndLaunchLocked(std::unique_lock<std::mutex>& lock,
                                                  int required) {
  std::vector<int> launch;
  if (required >= 0) launch.push_back(required);
  if (!recording_ && phase_ != Phase::kIdle && config_.prefetch > 0 && !gathered_all_) {
    // The next position someone is expected to enter bounds the prefetch window.
    size_t next = 0;
    while (next < sched_.size() &&
           (skipped_[next] || units_[sched_[next]].entered_in_phase > occurrence_[next])) {
      ++next;
    }
    const size_t window_end = next + static_cast<size_t>(config_.prefetch);
    int64_t live = live_.load();
    if (required >= 0) live += units_[required].bytes;  // not yet counted
    while (launch_pos_ < sched_.size() && launch_pos_ < window_end) {
      if (SkippableLocked(launch_pos_)) {
        skipped_[launch_pos_++] = true;
        continue;
      }
      const int u = sched_[launch_pos_];
      // Deferred (retried at the next call) past the live limit, or where a bounded buffer
      // pool shared with the gradients has no room: a prefetch never waits for the pool.
      if (live + units_[u].bytes > limit_ || !PoolFitsLocked(u)) break;
      live += units_[u].bytes;
      launch.push_back(u);
      units_[u].state = UnitState::kLaunching;  // reserved: later positions see it live
      ++launch_pos_;
    }
  }
  const bool before = phase_ != Phase::kBackward;
  return LaunchLocked(lock, launch, before);
}

absl::Status UnitScheduler::Begin(int unit, bool forward) {
  const char* what = Name(forward, true);
  RETURN_IF_ERROR(CheckUnit(what, unit));
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  if (gathered_all_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " unit ", unit,
        ": every unit is gathered by braid_optimizer_summon_params; end the summon first"));
  }
  if (forward && phase_ == Phase::kBackward) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " unit ", unit,
                     ": the backward of this step has begun; call braid_optimizer_end_step first"));
  }
  const Phase want = forward ? Phase::kForward : Phase::kBackward;
  if (phase_ != want) StartPhaseLocked(want);
  Unit& un = units_[unit];
  int required = -1;
  if (un.state == UnitState::kReleased) {
    if (recording_) {
      if (forward) order_.push_back(unit);
    } else {
      // The next position expected to be entered.
      size_t p = 0;
      while (p < sched_.size() &&
             (skipped_[p] || units_[sched_[p]].entered_in_phase > occurrence_[p])) {
        ++p;
      }
      const char* sched_name = forward
                                   ? "forward order recorded in the first step"
                                   : "backward order (the reverse of the recorded forward order)";
      if (p == sched_.size()) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, " unit ", unit, ": unit ", unit,
                         " is not gathered and no unit is expected any "
                         "more in this phase (the ",
                         sched_name, " is ", OrderString(sched_), ")"));
      }
      if (sched_[p] != unit) {
        return absl::FailedPreconditionError(
            absl::StrCat(what, " unit ", unit, ": expected unit ", sched_[p], " next, got unit ",
                         unit, " (not gathered; the ", sched_name, " is ", OrderString(sched_),
                         "; every rank must follow it)"));
      }
      // The launch cursor is at p: positions before it were launched, entered or skipped.
      while (launch_pos_ < p && SkippableLocked(launch_pos_)) skipped_[launch_pos_++] = true;
      if (launch_pos_ != p) {
        return absl::InternalError(absl::StrCat(what, " unit ", unit, ": launch cursor at ",
                                                launch_pos_, ", expected position ", p));
      }
      ++launch_pos_;
    }
    required = unit;
  }
  ++un.entered_in_phase;
  ++(forward ? un.fwd_active : un.bwd_active);
  absl::Status st = DecideAndLaunchLocked(lock, required);
  if (!st.ok()) return st;
  if (!cv_.wait_for(lock, absl::ToChronoSeconds(config_.timeout),
                    [&] { return un.state != UnitState::kLaunching; })) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " unit ", unit, ": its launch on another thread did not finish within ",
                     absl::FormatDuration(config_.timeout)));
  }
  lock.unlock();
  for (int b : un.buckets) {
    st = gatherer_->WaitParams(b);
    if (!st.ok()) return WithContext(st, absl::StrCat(what, " unit ", unit));
  }
  lock.lock();
  if (un.state == UnitState::kLaunched) un.state = UnitState::kGathered;
  return absl::OkStatus();
}

absl::Status UnitScheduler::ReleaseLocked(int u) {
  Unit& un = units_[u];
  if (un.state == UnitState::kReleased) return absl::OkStatus();
  absl::Status first;
  for (int b : un.buckets) {
    absl::Status st = gatherer_->Release(b);
    if (absl::IsFailedPrecondition(st)) {  // still in flight (only prefetched): wait first
      st = gatherer_->WaitParams(b);
      if (st.ok()) st = gatherer_->Release(b);
    }
    if (first.ok() && !st.ok()) first = WithContext(st, absl::StrCat("releasing unit ", u));
  }
  un.state = UnitState::kReleased;
  AddLive(-un.bytes);
  if (tl_ != nullptr) tl_->Instant(tl_row_, "release unit", u);
  return first;
}

absl::Status UnitScheduler::End(int unit, bool forward) {
  const char* what = Name(forward, false);
  RETURN_IF_ERROR(CheckUnit(what, unit));
  std::unique_lock<std::mutex> lock(mu_);
  Unit& un = units_[unit];
  int& active = forward ? un.fwd_active : un.bwd_active;
  if (active == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " unit ", unit, ": unit ", unit, " is not in its ",
                     forward ? "forward" : "backward", " (no braid_unit_enter(", unit, ", ",
                     forward ? "BRAID_PHASE_FORWARD" : "BRAID_PHASE_BACKWARD", ") before it)"));
  }
  --active;
  bool release;
  if (forward) {
    release = config_.reshard_after_forward && un.fwd_active == 0 && un.bwd_active == 0;
  } else {
    release = un.bwd_active == 0;
    if (release) un.fwd_active = 0;  // its forward use is over too (a root kept into backward)
  }
  absl::Status st;
  if (release) {
    cv_.wait(lock, [&] { return un.state != UnitState::kLaunching; });
    st = ReleaseLocked(unit);
  }
  if (!broken_.ok()) return st.ok() ? broken_ : st;
  absl::Status pre = DecideAndLaunchLocked(lock, -1);  // deferred prefetches
  return st.ok() ? pre : st;
}

absl::Status UnitScheduler::BeginForward(int unit) { return Begin(unit, true); }
absl::Status UnitScheduler::EndForward(int unit) { return End(unit, true); }
absl::Status UnitScheduler::BeginBackward(int unit) { return Begin(unit, false); }
absl::Status UnitScheduler::EndBackward(int unit) { return End(unit, false); }

absl::Status UnitScheduler::EndStep() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  // Every launch has run (the collective below is ordered after them).
  if (!cv_.wait_for(lock, absl::ToChronoSeconds(config_.timeout),
                    [&] { return serving_ticket_ == next_ticket_; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("ending the step: launches on other threads did not finish within ",
                     absl::FormatDuration(config_.timeout)));
  }
  std::vector<std::string> held;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& un = units_[u];
    if (un.fwd_active == 0 && un.bwd_active == 0 && un.state == UnitState::kReleased) continue;
    std::vector<std::string> why;
    if (un.fwd_active > 0) why.push_back("in its forward");
    if (un.bwd_active > 0) why.push_back("in its backward");
    if (un.state != UnitState::kReleased) why.push_back("gathered");
    held.push_back(absl::StrCat("unit ", u, " (", absl::StrJoin(why, ", "), ")"));
  }
  const std::string held_msg = absl::StrCat(
      "units still held at the end of the step: ", absl::StrJoin(held, "; "),
      gathered_all_ ? " (braid_optimizer_summon_params gathered them: end the summon first)"
                    : " (every braid_unit_enter needs its braid_unit_exit)");
  if (recording_) {
    // Collective: [units held, order length, order hash, first kShownUnits units (-1 padded)].
    std::vector<int64_t> mine(3 + kShownUnits, -1);
    mine[0] = static_cast<int64_t>(held.size());
    mine[1] = static_cast<int64_t>(order_.size());
    mine[2] = static_cast<int64_t>(HashOrder(order_));
    for (size_t k = 0; k < kShownUnits && k < order_.size(); ++k) mine[3 + k] = order_[k];
    absl::StatusOr<std::vector<int64_t>> all =
        gatherer_->ExchangeInts(mine, "end of step: forward order check");
    if (!all.ok()) return all.status();
    const size_t n = all->size() / mine.size();
    bool same = true, any_held = false;
    std::vector<std::string> per_rank, holders;
    for (size_t r = 0; r < n; ++r) {
      const int64_t* rec = all->data() + r * mine.size();
      same &= rec[1] == (*all)[1] && rec[2] == (*all)[2];
      if (rec[0] > 0) {
        any_held = true;
        holders.push_back(absl::StrCat("rank ", r, " holds ", rec[0], " unit(s)"));
      }
      std::vector<int64_t> shown;
      for (size_t k = 0; k < kShownUnits && rec[3 + k] >= 0; ++k) shown.push_back(rec[3 + k]);
      per_rank.push_back(
          absl::StrCat("rank ", r, ": ", rec[1], " unit(s) [", absl::StrJoin(shown, ", "),
                       rec[1] > static_cast<int64_t>(kShownUnits) ? ", ..." : "", "]"));
    }
    if (!same) {
      broken_ = absl::FailedPreconditionError(absl::StrCat(
          "the forward order recorded in the first step differs across the ranks of group "
          "'",
          gatherer_->group().name(), "' (every rank must enter the units in the same order): ",
          absl::StrJoin(per_rank, "; ")));
      return broken_;
    }
    if (any_held) {
      return absl::FailedPreconditionError(
          held.empty() ? absl::StrCat("other ranks still hold units at the end of the step: ",
                                      absl::StrJoin(holders, "; "))
                       : held_msg);
    }
    recording_ = false;
  } else if (!held.empty()) {
    return absl::FailedPreconditionError(held_msg);
  }
  phase_ = Phase::kIdle;
  StartPhaseLocked(Phase::kIdle);
  return absl::OkStatus();
}

absl::Status UnitScheduler::GatherAll() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  if (gathered_all_)
    return absl::FailedPreconditionError("every unit is already summoned (end the summon first)");
  std::vector<int> launch;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& un = units_[u];
    if (un.fwd_active > 0 || un.bwd_active > 0 || un.state != UnitState::kReleased) {
      return absl::FailedPreconditionError(
          absl::StrCat("summoning every unit: unit ", u,
                       " is entered or gathered (summon outside a step, after "
                       "braid_optimizer_end_step)"));
    }
    if (!un.buckets.empty()) launch.push_back(static_cast<int>(u));
  }
  gathered_all_ = true;
  RETURN_IF_ERROR(LaunchLocked(lock, launch, /*call_before_gather=*/true));
  lock.unlock();
  for (int b = 0; b < gatherer_->num_buckets(); ++b) {
    RETURN_IF_ERROR(WithContext(gatherer_->WaitParams(b), "summoning every unit"));
  }
  lock.lock();
  for (int u : launch) {
    if (units_[u].state == UnitState::kLaunched) units_[u].state = UnitState::kGathered;
  }
  return absl::OkStatus();
}

absl::Status UnitScheduler::ReleaseAll() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!gathered_all_) return absl::OkStatus();
  cv_.wait(lock, [&] { return serving_ticket_ == next_ticket_; });
  absl::Status first;
  for (size_t u = 0; u < units_.size(); ++u) {
    absl::Status st = ReleaseLocked(static_cast<int>(u));
    if (first.ok()) first = st;
  }
  gathered_all_ = false;
  // Summoning is outside training: the whole model's buffers, now free, go back instead of
  // staying in the gatherer's pool (training's own working set is pooled again as it runs).
  gatherer_->TrimPool();
  return first;
}

}  // namespace braid::sched
