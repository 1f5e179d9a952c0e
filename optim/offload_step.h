// The offloaded step of one bucket's shard (OptimizerConfig::offload, device parameters, f32
// state in host memory): the reduced gradient shard comes to the host staging buffer, the CPU
// kernels step the host state (HostStep: bit for bit the host run's), and the model-dtype shard
// goes back into the gatherer's device shard, queued ahead of the gather.
//
//   ++shard.steps;
//   RETURN_IF_ERROR(OffloadStep(pool, shard, ShardStepArgs{kind, &hyper, dtype, grad, out, 1.0},
//                               ops, reduced->device_event(), absl::Seconds(300), "world"));
//
// Contract: `grad` and `out` are device memory of the stream `ops` orders; the shard's state and
// staging buffers are host memory. One host wait (Synchronize within `timeout`) for the gradient
// copy, which also covers the previous step's copy out of the parameter staging buffer. The
// copy back is only queued: the caller records the step's completion after it. The error names
// the bucket and the group.
#ifndef BRAID_OPTIM_OFFLOAD_STEP_H_
#define BRAID_OPTIM_OFFLOAD_STEP_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/buffer_ops.h"
#include "optim/optimizer_shard.h"
#include "optim/parallel_for.h"

namespace braid::optim {

absl::Status OffloadStep(KernelPool& pool, OptimizerShard& shard, const ShardStepArgs& args,
                         BufferOps& ops, DeviceEvent reduced, absl::Duration timeout,
                         const std::string& group);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_OFFLOAD_STEP_H_
