// C API: fully sharded units (braid_unit_enter / exit, end_step, summon_params).
#include <memory>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/convert.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/status_macros.h"

using braid::capi::Find;
using braid::capi::Guard;
using braid::capi::OptimizerImpl;

namespace braid::capi {
namespace {

// The optimizer's unit scheduler; FailedPrecondition naming `fn` when it has none.
absl::StatusOr<sched::UnitScheduler*> Units(OptimizerImpl& o, const char* fn) {
  if (sched::UnitScheduler* u = o.stack().units()) return u;
  return absl::FailedPreconditionError(absl::StrCat(
      fn, " needs an optimizer created with fully_sharded = 1 (this one gathers after its step)"));
}

// By reference: a caller's out-of-range value is never loaded as the enum type (RawEnum).
absl::Status CheckPhase(const braid_phase_t& phase) {
  const int raw = RawEnum(phase);
  if (raw == BRAID_PHASE_FORWARD || raw == BRAID_PHASE_BACKWARD) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("phase ", raw, " is not a braid_phase_t"));
}

}  // namespace
}  // namespace braid::capi

extern "C" {

braid_status_t braid_unit_enter(braid_optimizer_t* opt, int unit, braid_phase_t phase) {
  return Guard("braid_unit_enter", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindParamSide(opt));
    RETURN_IF_ERROR(braid::capi::CheckPhase(phase));
    ASSIGN_OR_RETURN(braid::sched::UnitScheduler * u, braid::capi::Units(*o, "braid_unit_enter"));
    return phase == BRAID_PHASE_FORWARD ? u->BeginForward(unit) : u->BeginBackward(unit);
  });
}

braid_status_t braid_unit_exit(braid_optimizer_t* opt, int unit, braid_phase_t phase) {
  return Guard("braid_unit_exit", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindParamSide(opt));
    RETURN_IF_ERROR(braid::capi::CheckPhase(phase));
    ASSIGN_OR_RETURN(braid::sched::UnitScheduler * u, braid::capi::Units(*o, "braid_unit_exit"));
    return phase == BRAID_PHASE_FORWARD ? u->EndForward(unit) : u->EndBackward(unit);
  });
}

braid_status_t braid_optimizer_end_step(braid_optimizer_t* opt) {
  return Guard("braid_optimizer_end_step", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindParamSide(opt));
    ASSIGN_OR_RETURN(braid::sched::UnitScheduler * u,
                     braid::capi::Units(*o, "braid_optimizer_end_step"));
    return u->EndStep();
  });
}

braid_status_t braid_optimizer_summon_params(braid_optimizer_t* opt, int on) {
  return Guard("braid_optimizer_summon_params", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto o, braid::capi::FindParamSide(opt));
    if (on != 0 && on != 1)
      return absl::InvalidArgumentError(absl::StrCat("on must be 0 or 1, got ", on));
    braid::sched::UnitScheduler* units = o->stack().units();
    if (units == nullptr) return on == 1 ? o->opt().WaitAllParams() : absl::OkStatus();
    return on == 1 ? units->GatherAll() : units->ReleaseAll();
  });
}

}  // extern "C"
