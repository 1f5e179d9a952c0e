// ReducerBucketState: one bucket's launch state in a GradientReducer's launch stages
// (scheduler/reducer_stages.h) for the current backward: how many of its parameters are still
// to be marked, their device events, its launch and completion flags, each stage's collective,
// and the Work that completes with its final result. Its memory is the BucketStorage's
// (scheduler/reducer_storage.h), not here.
//
//   ReducerBucketState& s = *buckets[b];
//   if (s.pending.fetch_sub(1) == 1) { /* the last parameter of b was marked: launch */ }
//
// Contract: `pending`, `events`/`n_events` are written by marking threads (atomics); the flags
// marked "guarded" are read and written under the stages' launch lock; `stage[k]` is written
// under it at launch and read by the completion callback of that stage; `has_partial` is
// touched only by b's completion callbacks and between backwards.
#ifndef BRAID_SCHEDULER_REDUCER_BUCKET_STATE_H_
#define BRAID_SCHEDULER_REDUCER_BUCKET_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "comm/tensor.h"
#include "comm/work.h"
#include "scheduler/comm_hook.h"

namespace braid::sched {

struct ReducerBucketState {
  std::string label;            // "bucket 3": names the bucket in errors
  std::atomic<int> pending{0};  // parameters not yet marked this backward
  // The device events given to MarkReady this backward (room for one per parameter: no
  // allocation when marking); the mark that completes the bucket reads them.
  std::unique_ptr<DeviceEvent[]> events;
  std::atomic<int> n_events{0};
  absl::Status prepare_error;  // the pre-launch cast failed (read at launch)
  bool ready = false;          // guarded
  bool first_done = false;     // guarded (hybrid)
  bool failed = false;         // guarded (hybrid)
  WorkPtr work;                // this backward's final result
  // The collective of each stage in this backward (0: reduce-scatter or all-reduce; 1: the
  // hybrid replica all-reduce): written under the lock at launch, watched after it is released
  // (OnComplete may run the callback inline, and the callback takes the lock).
  struct Stage {
    WorkPtr work;
    int post_divide = 1;
    int64_t start_ns = 0;  // timeline only
    // With a comm hook: the hook that ran this stage (null: the default collective), its
    // result, and where the reducer puts it (`count` elements of the reduction dtype).
    std::shared_ptr<CommHook> hook;
    CommResult hooked;
    char* recv = nullptr;
    size_t count = 0;
    CommStage kind = CommStage::kAllReduce;
  } stage[2];
  std::string hook_label;  // "bucket 3 (comm hook 'bf16')" while a hook is registered
  // Hybrid reduce_scatter_only: BucketStorage::Partial(b) holds the window's sum so far.
  bool has_partial = false;
  WorkPtr handoff;  // device hybrid, pooled storage: the shard copy's point on the shard stream
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_REDUCER_BUCKET_STATE_H_
