// Internal to the reducer (gradient_reducer.cc, reducer_replan.cc): one bucket's state.
#ifndef BRAID_SCHEDULER_REDUCER_BUCKET_STATE_H_
#define BRAID_SCHEDULER_REDUCER_BUCKET_STATE_H_

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "comm/buffer_ops.h"
#include "comm/tensor.h"
#include "comm/work.h"
#include "scheduler/gradient_reducer.h"

namespace braid::sched {

// Bucket storage is allocated in multiples of this (and pooled by that size).
inline constexpr size_t kStorageAlign = 64;

struct GradientReducer::BucketState {
  OwnedBuffer data;             // padded_count elements, zero-initialized
  std::string label;            // "bucket 3": names the bucket in errors
  std::atomic<int> pending{0};  // parameters not yet marked this backward
  // The device events given to MarkReady this backward (room for one per parameter: no
  // allocation when marking); the mark that completes the bucket reads them.
  std::unique_ptr<DeviceEvent[]> events;
  std::atomic<int> n_events{0};
  absl::Status prepare_error;  // the pre-launch cast failed (read at launch)
  bool ready = false;          // guarded by mu_
  bool first_done = false;     // guarded by mu_ (hybrid)
  bool failed = false;         // guarded by mu_ (hybrid)
  WorkPtr work;                // this backward's final result
  // The collective of each stage in this backward (0: reduce-scatter or all-reduce; 1: the
  // hybrid replica all-reduce): written under mu_ at launch, watched after mu_ is released
  // (OnComplete may run the callback inline, and the callback takes mu_).
  struct Stage {
    WorkPtr work;
    int post_divide = 1;
    int64_t start_ns = 0;  // timeline only
  } stage[2];
  // Hybrid reduce_scatter_only: this rank's shard summed over the window's microbatches so far
  // (each already averaged over the shard group), added in before the replica all-reduce.
  OwnedBuffer partial;
  bool has_partial = false;
  // reduce_dtype: the bucket widened (padded_count elements of the reduce dtype).
  OwnedBuffer staging;
  // keep_shards_only: `data` and `staging` are pool buffers held only while the bucket is
  // filled and reduced; storage_mu serializes taking them at the first mark.
  std::mutex storage_mu;
  OwnedBuffer kept;     // this rank's reduced shard (shard_count, bucket dtype)
  OwnedBuffer reduced;  // hybrid with f32 staging: the f32 shard (replica all-reduce, partials)
  WorkPtr handoff;      // device hybrid: the shard copy's point on the shard stream
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_REDUCER_BUCKET_STATE_H_
