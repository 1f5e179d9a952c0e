// StepPhase: where the sharded optimizer is in its cycle of backwards and steps, as one value.
// With `overlap` a step runs while its backward is still in progress, so the phases that hold a
// step say whether the backward is still open (kArmedInBackward, kSteppingInBackward).
//
//   StepPhase p = StepPhase::kIdle;
//   p = AfterBeginBackward(p, sched::SyncMode::kSync, /*overlap=*/true);  // kArmedInBackward
//   p = AfterRun(p);                                                      // kSteppingInBackward
//   p = AfterFinishBackward(p, /*overlap=*/true);                          // kStepping
//   p = AfterComplete(p);                                                  // kIdle
//
// Transitions (every other event leaves the phase as it is; the optimizer refuses the calls
// that would need one that is not listed, e.g. BeginBackward in kAwaitingStep):
//   kIdle, kWindowOpen --BeginBackward(no_sync | reduce_scatter_only)--> kAccumulating
//   kIdle, kWindowOpen --BeginBackward(sync)--> kArmedInBackward (overlap) | kSyncBackward
//   kAccumulating --FinishBackward--> kWindowOpen
//   kSyncBackward --FinishBackward--> kIdle (overlap: its step already completed)
//                                   | kAwaitingStep (no overlap)
//   kArmedInBackward --FinishBackward--> kArmed;  kSteppingInBackward --> kStepping
//   kAwaitingStep --Step()--> kArmed
//   kArmedInBackward --run--> kSteppingInBackward;  kArmed --run--> kStepping
//   kArmedInBackward, kSteppingInBackward --complete | cancel--> kSyncBackward
//   kArmed, kStepping --complete | cancel--> kIdle
// Not thread-safe: the optimizer keeps its phase under its mutex.
#ifndef BRAID_OPTIM_STEP_PHASE_H_
#define BRAID_OPTIM_STEP_PHASE_H_

#include "scheduler/gradient_reducer.h"

namespace braid::optim {

enum class StepPhase {
  kIdle,                // between steps
  kAccumulating,        // inside a no_sync / reduce_scatter_only backward
  kWindowOpen,          // after one: the window's gradients wait for its synced backward
  kSyncBackward,        // inside a synced backward with no step armed
  kAwaitingStep,        // overlap off: a synced backward finished; Step() is due
  kArmedInBackward,     // overlap: inside a synced backward; its step waits for the stepper
  kSteppingInBackward,  // overlap: inside a synced backward; its step runs
  kArmed,               // a step waits to run (the backward is over)
  kStepping,            // a step runs (the backward is over)
};

// Inside a backward (BeginBackward called, FinishBackward not yet).
inline bool InBackward(StepPhase p) {
  return p == StepPhase::kAccumulating || p == StepPhase::kSyncBackward ||
         p == StepPhase::kArmedInBackward || p == StepPhase::kSteppingInBackward;
}
// Inside an accumulation window (its gradients are not stepped until its synced backward).
inline bool InWindow(StepPhase p) {
  return p == StepPhase::kAccumulating || p == StepPhase::kWindowOpen;
}
// A step is armed: waiting to run or running.
inline bool StepArmed(StepPhase p) {
  return p == StepPhase::kArmedInBackward || p == StepPhase::kSteppingInBackward ||
         p == StepPhase::kArmed || p == StepPhase::kStepping;
}
// A step is armed and nobody runs it yet (what the stepper thread waits for).
inline bool StepWaitingToRun(StepPhase p) {
  return p == StepPhase::kArmedInBackward || p == StepPhase::kArmed;
}

inline StepPhase AfterBeginBackward(StepPhase p, sched::SyncMode mode, bool overlap) {
  if (p != StepPhase::kIdle && p != StepPhase::kWindowOpen) return p;
  if (mode != sched::SyncMode::kSync) return StepPhase::kAccumulating;
  return overlap ? StepPhase::kArmedInBackward : StepPhase::kSyncBackward;
}

inline StepPhase AfterFinishBackward(StepPhase p, bool overlap) {
  switch (p) {
    case StepPhase::kAccumulating:
      return StepPhase::kWindowOpen;
    case StepPhase::kSyncBackward:
      return overlap ? StepPhase::kIdle : StepPhase::kAwaitingStep;
    case StepPhase::kArmedInBackward:
      return StepPhase::kArmed;
    case StepPhase::kSteppingInBackward:
      return StepPhase::kStepping;
    default:
      return p;
  }
}

// Step() arms the step of a finished synced backward (overlap off).
inline StepPhase AfterStepCall(StepPhase p) {
  return p == StepPhase::kAwaitingStep ? StepPhase::kArmed : p;
}

// The armed step starts running.
inline StepPhase AfterRun(StepPhase p) {
  if (p == StepPhase::kArmedInBackward) return StepPhase::kSteppingInBackward;
  if (p == StepPhase::kArmed) return StepPhase::kStepping;
  return p;
}

// The armed step completed (or was cancelled).
inline StepPhase AfterComplete(StepPhase p) {
  if (p == StepPhase::kArmedInBackward || p == StepPhase::kSteppingInBackward) {
    return StepPhase::kSyncBackward;
  }
  if (p == StepPhase::kArmed || p == StepPhase::kStepping) return StepPhase::kIdle;
  return p;
}

}  // namespace braid::optim

#endif  // BRAID_OPTIM_STEP_PHASE_H_
