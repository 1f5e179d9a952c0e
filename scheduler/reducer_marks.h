// ReducerMarks: how many times each parameter of a GradientReducer is marked ready per backward,
// and whether a mark completes it. A tied or reused parameter (GPT-2's embedding shared with
// its output head; a weight whose gradient hook fires inside and outside a reentrant
// checkpoint) is marked once per contribution; its bucket may launch only after the last one.
// The count is declared (ParamSpec::marks >= 1; 1 by default) or, with kCountMarks, counted in
// the first synced backward that marks the parameter: until then its marks only count, and it
// becomes ready at FinishBackward (its bucket, and those after it, launch there, as torch DDP's
// static_graph does in its first iteration).
//
//   ReducerMarks marks(plan);
//   marks.Begin();                                           // each backward
//   ASSIGN_OR_RETURN(ReducerMarks::Mark m, marks.Add(i, /*launching=*/true));
//   if (m.completes) stages.ParamReady(bucket);              // the last contribution
//   ... FinishBackward: marks.Settle(i) for every parameter ...
//
// Contract: Add may be called from any thread; a mark beyond the count is refused (nothing is
// counted) with an error naming the parameter, so no contribution is silently left out of a
// bucket already reduced. Callers passing gradient values hold lock(i) around Add and the copy
// or add, so the mark numbered 0 (the copy) precedes the others (the adds). Begin and Settle run
// between marks (the reducer's BeginBackward / FinishBackward).
#ifndef BRAID_SCHEDULER_REDUCER_MARKS_H_
#define BRAID_SCHEDULER_REDUCER_MARKS_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/bucket_plan.h"

namespace braid::sched {

class ReducerMarks {
 public:
  // InvalidArgument naming the parameter for a negative ParamSpec::marks.
  static absl::Status Check(const std::vector<ParamSpec>& params);
  // `plan` is the reducer's and outlives this (its parameter order survives re-plans).
  explicit ReducerMarks(const BucketPlan& plan);

  struct Mark {
    int index = 0;           // 0 for the parameter's first mark of this backward
    bool completes = false;  // its count is known and this was its last mark
  };
  // Clears this backward's counts.
  void Begin();
  // One mark of parameter i. `launching`: a synced (or reduce_scatter_only) backward.
  // FailedPrecondition naming the parameter when its count is known and already reached.
  absl::StatusOr<Mark> Add(int i, bool launching);
  void Undo(int i);  // a mark whose gradient could not be taken: it never happened
  // Parameter i is reduced as zeros in this backward (declared unused, or unmarked at
  // FinishBackward): a later Add is refused naming it, and Settle is not asked.
  void SetUnused(int i) { state_[i].unused.store(true, std::memory_order_release); }
  bool unused(int i) const { return state_[i].unused.load(std::memory_order_acquire); }
  int count(int i) const { return state_[i].count.load(std::memory_order_acquire); }
  // The declared or counted marks of i; kCountMarks while not counted yet.
  int expected(int i) const { return state_[i].expected; }
  std::mutex& lock(int i) { return state_[i].mu; }

  // FinishBackward of a launching backward, parameter i marked count(i) > 0 times: kLearned
  // when this backward counted it (it becomes ready now), kComplete when its last mark made it
  // ready already, else FailedPrecondition naming it (fewer marks than its count).
  enum class Settled { kComplete, kLearned };
  absl::StatusOr<Settled> Settle(int i);

 private:
  struct State {
    std::atomic<int> count{0};        // marks in this backward
    std::atomic<bool> unused{false};  // reduced as zeros in this backward (SetUnused)
    int expected = 1;                 // kCountMarks: not counted yet
    bool declared = true;             // the count came from ParamSpec::marks
    std::mutex mu;                    // marks passing values: serializes copy and adds
  };
  const BucketPlan& plan_;
  std::unique_ptr<State[]> state_;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_REDUCER_MARKS_H_
