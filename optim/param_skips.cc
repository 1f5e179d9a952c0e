#include "optim/param_skips.h"

namespace braid::optim {

const std::vector<StepRun>& ParamSkips::Plan(const std::vector<Segment>& segments, int64_t steps,
                                             const std::vector<int>& bucket_params,
                                             const uint8_t* used) {
  bool skipped_now = false;
  if (used != nullptr) {
    for (size_t k = 0; k < bucket_params.size(); ++k) {
      if (used[bucket_params[k]] == 0) {
        ++skips_[k];
        skipped_now = true;
      }
    }
  }
  runs_.clear();
  if (!skipped_now && !any()) {  // the common case: the segments, as without skipping
    for (const Segment& s : segments) runs_.push_back(StepRun{s.lo, s.hi, s.group, steps});
    return runs_;
  }
  for (const Piece& p : pieces_) {
    if (used != nullptr && used[bucket_params[p.k]] == 0) continue;
    const int64_t own = StepsOf(p.k, steps);
    if (!runs_.empty() && runs_.back().hi == p.lo && runs_.back().group == p.group &&
        runs_.back().steps == own) {
      runs_.back().hi = p.hi;  // adjacent, same group and count: one kernel call (elementwise)
    } else {
      runs_.push_back(StepRun{p.lo, p.hi, p.group, own});
    }
  }
  return runs_;
}

bool ParamSkips::any() const {
  for (int64_t s : skips_) {
    if (s != 0) return true;
  }
  return false;
}

void ParamSkips::Reset() {
  for (int64_t& s : skips_) s = 0;
}

}  // namespace braid::optim
