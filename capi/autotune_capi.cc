// C API: the autotuner (braid_reducer_autotune over the stack's Autotune, optim/training_stack.h).
#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/status_macros.h"

using braid::capi::Find;
using braid::capi::Guard;
using braid::capi::ReducerImpl;

extern "C" {

braid_status_t braid_reducer_autotune(braid_reducer_t* reducer, double step_seconds, int* replanned,
                                      int* done) {
  return Guard("braid_reducer_autotune", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    if (replanned != nullptr) *replanned = 0;
    if (done != nullptr) *done = 0;
    // A failed or unmeasurable step (negative, NaN) counts as infinitely slow.
    const absl::Duration took = step_seconds >= 0 && step_seconds < 1e9
                                    ? absl::Seconds(step_seconds)
                                    : absl::InfiniteDuration();
    braid::capi::GroupLocks locks(*r);  // collective on the reducer's groups
    ASSIGN_OR_RETURN(braid::optim::TrainingStack::TuneStep step, r->stack->Autotune(took));
    if (replanned != nullptr) *replanned = step.replanned ? 1 : 0;
    if (done != nullptr) *done = step.done ? 1 : 0;
    return absl::OkStatus();
  });
}

}  // extern "C"
