// The low-precision wire hook (torch's fp16_compress_hook / bf16_compress_hook): each bucket
// is rounded to f16 or bf16, divided by the group size in that dtype, summed across the group
// in the wire dtype, and widened back into the bucket. Half the bytes of f32 on the wire.
//
//   ASSIGN_OR_RETURN(auto hook, MakeLowPrecisionHook({DType::kF16}));
//   RETURN_IF_ERROR(reducer->SetCommHook(hook));
//
// Exact in its own terms: per element, h_r = wire(wire(x_r) / n) on every rank r, then the
// backend's sum of the h_r in the wire dtype, widened. With `half_wire` (the default) the sum
// crosses as 2 bytes per element everywhere: local, an f32 sum in group-rank order rounded once;
// nccl, mpi and gloo, each hop widened to f32, added and rounded back, in the association of
// the backend's algorithm. half_wire = false: mpi and gloo sum in f32, rounded once. `replica_only`
// (hybrid reducers): only the replica all-reduce, the stage that crosses hosts, goes on the
// low-precision wire; the shard stage stays exact. Host memory; refuses a bucket that is not f32 or
// f64 (nothing to gain, and the rounding would be double).
#ifndef BRAID_SCHEDULER_HOOKS_LOW_PRECISION_H_
#define BRAID_SCHEDULER_HOOKS_LOW_PRECISION_H_

#include <memory>

#include "absl/status/statusor.h"
#include "scheduler/comm_hook.h"

namespace braid::sched {

struct LowPrecisionOptions {
  DType wire = DType::kBF16;  // kBF16 or kF16
  bool replica_only = false;
  bool half_wire = true;  // CollectiveOptions::half_wire on the hook's collectives
};

// InvalidArgument for a wire dtype other than bf16 / f16.
absl::StatusOr<std::shared_ptr<CommHook>> MakeLowPrecisionHook(const LowPrecisionOptions& opts);
// torch's allreduce_hook ("allreduce"): the same divide-then-sum in the bucket's own dtype (any
// floating bucket). The default path sums then divides: equal at power-of-two group sizes,
// rounded differently otherwise.
std::shared_ptr<CommHook> MakeDivideFirstHook(bool replica_only = false);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_HOOKS_LOW_PRECISION_H_
