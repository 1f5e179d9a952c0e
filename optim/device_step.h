// The device step of one bucket's shard: queued on the shard group's stream after the
// reduction's last device operation, the device kernels' fused AdamW / SGD per parameter-group
// segment, writing the model dtype straight into the gatherer's shard. The host does not wait.
//
//   ++shard.steps;
//   RETURN_IF_ERROR(QueueDeviceStep(*config.device_kernels, shard,
//                                   ShardStepArgs{kind, &hyper, dtype, grad, out, clip_scale},
//                                   shard_group.buffer_ops(), reduced->device_event(), "world"));
//
// Contract: `grad`, `out` and the shard's state are device memory of the stream `ops` orders;
// each element's update is optim/adamw_math.h's, bit for bit (DeviceStepKernels' contract).
// The error names the bucket and the group. The caller records the step's completion after it
// (what the bucket's all-gather waits on).
#ifndef BRAID_OPTIM_DEVICE_STEP_H_
#define BRAID_OPTIM_DEVICE_STEP_H_

#include <string>

#include "absl/status/status.h"
#include "comm/buffer_ops.h"
#include "optim/optimizer_shard.h"
#include "optim/step_kernels.h"

namespace braid::optim {

absl::Status QueueDeviceStep(DeviceStepKernels& kernels, OptimizerShard& shard,
                             const ShardStepArgs& args, BufferOps& ops, DeviceEvent reduced,
                             const std::string& group);

}  // namespace braid::optim

#endif  // BRAID_OPTIM_DEVICE_STEP_H_
