#include "optim/offload_step.h"

#include <cstddef>

#include "absl/strings/str_cat.h"
#include "optim/host_step.h"

namespace braid::optim {

absl::Status OffloadStep(KernelPool& pool, OptimizerShard& shard, const ShardStepArgs& args,
                         BufferOps& ops, DeviceEvent reduced, absl::Duration timeout,
                         const std::string& group) {
  const size_t bytes = shard.n * DTypeSize(args.dtype);
  const auto named = [&](const absl::Status& st) {
    return absl::Status(st.code(), absl::StrCat("offloaded optimizer step of ", shard.label,
                                                " (group '", group, "'): ", st.message()));
  };
  // Device -> host after the reduction's last device operation (hybrid: on the replica
  // group's stream). The Synchronize is the step's one host wait; it also covers the previous
  // step's copy out of param_host, which is rewritten below.
  absl::Status st = ops.WaitFor(reduced);
  if (st.ok()) st = ops.Copy(shard.grad_host.get(), args.grad, bytes);
  if (st.ok()) st = ops.Synchronize(absl::Now() + timeout);
  if (!st.ok()) return named(st);
  ShardStepArgs host = args;
  host.grad = shard.grad_host.get();
  host.out = shard.param_host.get();
  HostStep(pool, shard, host);
  // Host -> the gatherer's device shard, queued; the caller records the step's event after it.
  st = ops.Copy(args.out, shard.param_host.get(), bytes);
  return st.ok() ? st : named(st);
}

}  // namespace braid::optim
