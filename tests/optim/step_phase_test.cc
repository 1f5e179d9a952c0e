// StepPhase: the optimizer's cycles of backwards and steps walked through the transition
// functions, and each phase's meaning checked against the booleans it replaced.
#include "optim/step_phase.h"

#include <iterator>
#include <vector>

#include "gtest/gtest.h"

namespace braid::optim {
namespace {

using sched::SyncMode;
using P = StepPhase;

const std::vector<P> kAll = {
    P::kIdle,         P::kAccumulating,    P::kWindowOpen,         P::kSyncBackward,
    P::kAwaitingStep, P::kArmedInBackward, P::kSteppingInBackward, P::kArmed,
    P::kStepping};

TEST(StepPhase, OverlappedStepCompletesAfterItsBackward) {
  P p = AfterBeginBackward(P::kIdle, SyncMode::kSync, /*overlap=*/true);
  EXPECT_EQ(p, P::kArmedInBackward);
  p = AfterRun(p);
  EXPECT_EQ(p, P::kSteppingInBackward);
  p = AfterFinishBackward(p, true);
  EXPECT_EQ(p, P::kStepping);
  EXPECT_EQ(AfterComplete(p), P::kIdle);
}

TEST(StepPhase, OverlappedStepCompletesInsideItsBackward) {
  P p = AfterComplete(AfterRun(AfterBeginBackward(P::kIdle, SyncMode::kSync, true)));
  EXPECT_EQ(p, P::kSyncBackward);
  EXPECT_TRUE(InBackward(p));
  EXPECT_FALSE(StepArmed(p));
  EXPECT_EQ(AfterFinishBackward(p, true), P::kIdle);
}

TEST(StepPhase, BackwardFinishedBeforeTheStepperStarted) {
  P p = AfterFinishBackward(AfterBeginBackward(P::kIdle, SyncMode::kSync, true), true);
  EXPECT_EQ(p, P::kArmed);
  EXPECT_TRUE(StepWaitingToRun(p));
  EXPECT_EQ(AfterComplete(AfterRun(p)), P::kIdle);
}

TEST(StepPhase, WithoutOverlapStepIsCalled) {
  P p = AfterBeginBackward(P::kIdle, SyncMode::kSync, /*overlap=*/false);
  EXPECT_EQ(p, P::kSyncBackward);
  p = AfterFinishBackward(p, false);
  EXPECT_EQ(p, P::kAwaitingStep);
  EXPECT_EQ(AfterBeginBackward(p, SyncMode::kSync, false), p) << "refused: Step() is due";
  p = AfterStepCall(p);
  EXPECT_EQ(p, P::kArmed);
  p = AfterRun(p);
  EXPECT_EQ(p, P::kStepping);
  EXPECT_EQ(AfterComplete(p), P::kIdle);
  EXPECT_EQ(AfterStepCall(P::kIdle), P::kIdle) << "no finished backward to step";
}

TEST(StepPhase, AccumulationWindow) {
  for (SyncMode mode : {SyncMode::kNoSync, SyncMode::kReduceScatterOnly}) {
    for (bool overlap : {false, true}) {
      P p = AfterBeginBackward(P::kIdle, mode, overlap);
      EXPECT_EQ(p, P::kAccumulating);
      p = AfterFinishBackward(p, overlap);
      EXPECT_EQ(p, P::kWindowOpen);
      EXPECT_EQ(AfterBeginBackward(p, mode, overlap), P::kAccumulating);
      EXPECT_EQ(AfterBeginBackward(p, SyncMode::kSync, overlap),
                overlap ? P::kArmedInBackward : P::kSyncBackward);
    }
  }
}

TEST(StepPhase, CancelledStepEndsLikeACompletedOne) {
  EXPECT_EQ(AfterComplete(P::kArmedInBackward), P::kSyncBackward);
  EXPECT_EQ(AfterComplete(P::kArmed), P::kIdle);
}

// The booleans the enum replaced, per phase: in_backward_, round_armed_, round_running_,
// stepable_, and sync_ != kSync.
TEST(StepPhase, PredicatesMatchTheOldBooleans) {
  struct Old {
    P p;
    bool in_backward, armed, running, stepable, window;
  };
  const Old table[] = {
      {P::kIdle, false, false, false, false, false},
      {P::kAccumulating, true, false, false, false, true},
      {P::kWindowOpen, false, false, false, false, true},
      {P::kSyncBackward, true, false, false, false, false},
      {P::kAwaitingStep, false, false, false, true, false},
      {P::kArmedInBackward, true, true, false, false, false},
      {P::kSteppingInBackward, true, true, true, false, false},
      {P::kArmed, false, true, false, false, false},
      {P::kStepping, false, true, true, false, false},
  };
  ASSERT_EQ(std::size(table), kAll.size());
  for (const Old& o : table) {
    SCOPED_TRACE(static_cast<int>(o.p));
    EXPECT_EQ(InBackward(o.p), o.in_backward);
    EXPECT_EQ(StepArmed(o.p), o.armed);
    EXPECT_EQ(StepWaitingToRun(o.p), o.armed && !o.running);
    EXPECT_EQ(InWindow(o.p), o.window);
  }
}

// Events that do not apply leave the phase as it is.
TEST(StepPhase, InapplicableEventsChangeNothing) {
  for (P p : kAll) {
    if (p != P::kIdle && p != P::kWindowOpen) {
      EXPECT_EQ(AfterBeginBackward(p, SyncMode::kSync, true), p);
    }
    if (!InBackward(p)) EXPECT_EQ(AfterFinishBackward(p, true), p);
    if (!StepArmed(p)) EXPECT_EQ(AfterComplete(p), p);
    if (!StepWaitingToRun(p)) EXPECT_EQ(AfterRun(p), p);
  }
}

}  // namespace
}  // namespace braid::optim
