// C API 0.10: the whole optimizer state, unsharded, in and out of caller memory
// (braid_optimizer_get_state / braid_optimizer_set_state; braid.h says what they mean).
//
// Both reuse the re-sharding code (optim/reshard.h): get is ShardedOptimizer::GatherCheckpoint
// copied out; set fills ShardedOptimizer::EmptyCheckpoint (this run's plan and header) from
// the caller, lays out this rank's part with CheckpointRank and loads it with LoadState, whose
// agreement step makes every rank load or none. Every check of the caller's input therefore
// goes into LoadState's source (a failed source fails every rank's load) rather than
// returning early, which would leave the peers waiting in LoadState's all-reduce.
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/impl.h"
#include "comm/status_macros.h"

using braid::capi::Guard;

namespace braid::capi {
namespace {

constexpr char kSetState[] = "braid_optimizer_set_state";

absl::Status CheckNumValues(size_t num_values, size_t buffers, size_t params) {
  if (num_values == buffers * params) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("num_values is ", num_values, "; this optimizer has ", buffers,
                   " state buffers x ", params, " parameters = ", buffers * params));
}

// This rank's state under its own plan from the caller's unsharded values.
absl::StatusOr<optim::LoadedState> StateFromCaller(const OptimizerImpl& o,
                                                   const float* const* values, size_t num_values,
                                                   const int64_t* param_steps, int64_t step) {
  if (values == nullptr) {
    return absl::FailedPreconditionError("values is NULL: the caller refused this rank's state");
  }
  optim::Checkpoint c = o.opt().EmptyCheckpoint();
  const auto& params = c.plan.params();
  RETURN_IF_ERROR(CheckNumValues(num_values, c.state_names.size(), params.size()));
  if (param_steps == nullptr) return absl::InvalidArgumentError("param_steps is NULL");
  if (step < 0)
    return absl::InvalidArgumentError(absl::StrCat("step is ", step, "; it must be >= 0"));
  for (size_t i = 0; i < params.size(); ++i) {
    if (param_steps[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("param_steps[", i, "] (", params[i].Label(),
                                                     ") is ", param_steps[i], "; it must be >= 0"));
    }
    c.steps[i] = param_steps[i];
    for (size_t k = 0; k < c.state_names.size(); ++k) {
      const float* src = values[k * params.size() + i];
      if (src == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("values[", k * params.size() + i, "] (",
                                                       c.state_names[k], " of ", params[i].Label(),
                                                       ") is NULL"));
      }
      std::memcpy(c.values[k][i].data(), src, params[i].count * sizeof(float));
    }
  }
  c.header.step = step;
  const optim::StateHeader& h = c.header;
  return optim::CheckpointRank(c, o.stack().reducer().plan(), h.rank, h.world_size, kSetState);
}

}  // namespace
}  // namespace braid::capi

extern "C" {

braid_status_t braid_optimizer_get_state(braid_optimizer_t* opt, float* const* values,
                                         size_t num_values, int64_t* param_steps, int64_t* step) {
  return Guard("braid_optimizer_get_state", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    RETURN_IF_ERROR(braid::capi::CheckNotNull(values, "values"));
    const auto& params = o->stack().reducer().plan().params();
    const size_t buffers =
        o->stack().param_options()->optimizer->kind == braid::optim::OptimizerKind::kAdamW ? 3 : 2;
    RETURN_IF_ERROR(braid::capi::CheckNumValues(num_values, buffers, params.size()));
    braid::optim::Checkpoint c;
    {
      braid::capi::GroupLocks locks(*o->reducer);  // all-gathers on the reducer's shard group
      ASSIGN_OR_RETURN(c, o->opt().GatherCheckpoint());
    }
    for (size_t k = 0; k < buffers; ++k) {
      for (size_t i = 0; i < params.size(); ++i) {
        float* dst = values[k * params.size() + i];
        if (dst != nullptr)
          std::memcpy(dst, c.values[k][i].data(), params[i].count * sizeof(float));
      }
    }
    if (param_steps != nullptr)
      std::memcpy(param_steps, c.steps.data(), params.size() * sizeof(int64_t));
    if (step != nullptr) *step = c.header.step;
    return absl::OkStatus();
  });
}

braid_status_t braid_optimizer_set_state(braid_optimizer_t* opt, const float* const* values,
                                         size_t num_values, const int64_t* param_steps,
                                         int64_t step) {
  return Guard(braid::capi::kSetState, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindOptimizer(opt));
    return o->opt().LoadState(
        braid::capi::StateFromCaller(*o, values, num_values, param_steps, step),
        braid::capi::kSetState);
  });
}

}  // extern "C"
