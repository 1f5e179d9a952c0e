// Internal to the optimizer (sharded_optimizer.cc, optimizer_state.cc): per-bucket state.
#ifndef BRAID_OPTIM_OPTIMIZER_BUCKET_H_
#define BRAID_OPTIM_OPTIMIZER_BUCKET_H_

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "comm/buffer_ops.h"
#include "comm/work.h"
#include "optim/sharded_optimizer.h"

namespace braid::optim {

// InvalidArgument naming the group and the hyper-parameter out of range.
absl::Status CheckHyper(const GroupHyper& h, OptimizerKind kind, int group);

// f32 state allocated through the shard group's BufferOps: host memory, or device memory on
// device groups (then only the stream-ordered operations and kernels touch it).
struct FloatBuffer {
  OwnedBuffer buf;
  float* get() const { return reinterpret_cast<float*>(buf.get()); }
  explicit operator bool() const { return static_cast<bool>(buf); }
};

// A range of this rank's shard holding (parts of) parameters of one group; padding between
// parameters and at the end of the bucket is never stepped.
struct Segment {
  size_t lo, hi;  // elements, relative to the shard start
  int group;
};

struct ShardedOptimizer::BucketState {
  std::string label;         // "bucket 3"
  size_t n = 0;              // shard_count
  FloatBuffer master, m, v;  // AdamW: exp_avg, exp_avg_sq; SGD: m = momentum buffer
  // Offload: host staging of the reduced gradient shard and of the stepped model-dtype shard
  // (bucket dtype, n elements each).
  OwnedBuffer grad_host, param_host;
  std::vector<Segment> segments;
  int64_t steps = 0;   // updates applied (bias correction); written by the round runner only
  bool dirty = false;  // SetParam changed the shard: the next WaitParams re-gathers
  // Device: the latest step's completion on the shard group's stream (its device event is what
  // the all-gather waits on; held so the event stays valid until the gather was queued).
  WorkPtr step_work;
  // Device, clipping / skip_nonfinite: where this bucket's block sums (each segment's
  // NormBlocks, back to back) start in the optimizer's norm_dev_ / norm_host_.
  size_t norm_offset = 0;
  // The armed step, guarded by mu_:
  bool reduced = true;
  absl::Status reduce_status;
  bool published = true;
  absl::Status publish_status;
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_OPTIMIZER_BUCKET_H_
