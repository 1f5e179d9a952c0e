#include <limits>

#include "absl/strings/str_cat.h"
#include "comm/dtype.h"
#include "tests/soak_rounds.h"

namespace braid::testing {

using optim::testing::SyncMode;

std::vector<SyncMode> RandomSchedule(std::mt19937_64& rng, bool hybrid) {
  std::vector<SyncMode> s;
  for (int k = static_cast<int>(rng() % 3); k > 0; --k)
    s.push_back((hybrid && rng() % 2) ? SyncMode::kReduceScatterOnly : SyncMode::kNoSync);
  s.push_back(SyncMode::kSync);
  return s;
}

void RandomizeOptimizer(std::mt19937_64& rng, int steps, optim::testing::OptScenario* s) {
  s->opt.kind = rng() % 3 == 0 ? optim::OptimizerKind::kSgd : optim::OptimizerKind::kAdamW;
  for (size_t& c : s->counts) c = 1 + rng() % 300;
  s->steps = steps;
  s->opt.overlap = rng() % 4 != 0;
  if (rng() % 3 == 0) s->opt.max_grad_norm = 0.5;
  if (rng() % 4 == 0) {
    s->opt.skip_nonfinite = true;
    s->inf_step = static_cast<int>(rng() % steps);
    if (rng() % 2) s->bad_value = std::numeric_limits<float>::quiet_NaN();
  }
}

std::string DescribeOptimizer(const optim::testing::OptScenario& s) {
  std::string schedule;
  for (SyncMode m : s.schedule)
    schedule += m == SyncMode::kSync ? 'S' : m == SyncMode::kNoSync ? 'N' : 'R';
  return absl::StrCat(s.replicas, "x", s.shards, " ", DTypeName(s.dtype), " ",
                      s.opt.kind == optim::OptimizerKind::kSgd ? "sgd" : "adamw", " cap ",
                      s.bucket_cap_bytes, " steps ", s.steps, " schedule ", schedule,
                      s.opt.overlap ? "" : " step()", s.opt.max_grad_norm > 0 ? " clip" : "",
                      s.opt.skip_nonfinite ? absl::StrCat(" skip_nonfinite (", s.bad_value,
                                                          " at step ", s.inf_step, ")")
                                           : "");
}

}  // namespace braid::testing
