// The host step of one bucket's shard: the CPU kernels (optim/adamw_kernel.h) over each
// parameter-group segment, and the shard's gradient squared norm that clipping and
// track_grad_norm sum.
//
//   ++shard.steps;                                    // the step's count (bias correction)
//   HostStep(pool, shard, ShardStepArgs{kind, &hyper, DType::kBF16, grad, out, clip_scale});
//   double sumsq = HostSquaredNorm(pool, shard, DType::kBF16, grad);
//
// Contract: `grad`, `out` and the shard's state are host memory; each element's update is
// optim/adamw_math.h's, bit for bit, whatever pool's thread count. The offloaded device step
// (offload_step.h) runs this same function on its staging buffers.
#ifndef BRAID_OPTIM_HOST_STEP_H_
#define BRAID_OPTIM_HOST_STEP_H_

#include "comm/dtype.h"
#include "optim/optimizer_shard.h"
#include "optim/parallel_for.h"

namespace braid::optim {

// Steps every segment of `shard` (at its current `steps`), writing the model dtype to args.out.
void HostStep(KernelPool& pool, OptimizerShard& shard, const ShardStepArgs& args);

// The sum of the segments' squared norms (SquaredNormF64), added in segment order.
double HostSquaredNorm(KernelPool& pool, const OptimizerShard& shard, DType dtype,
                       const char* grad);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_HOST_STEP_H_
