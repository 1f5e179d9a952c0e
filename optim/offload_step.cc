// ShardedOptimizer's offloaded step (OptimizerConfig::offload with device parameters): the
// reduced gradient shard comes to the host, the CPU kernels step the host state, the
// model-dtype shard goes back to the device ahead of the gather.
#include <cstddef>

#include "absl/strings/str_cat.h"
#include "optim/optimizer_bucket.h"
#include "optim/sharded_optimizer.h"

namespace braid::optim {

absl::Status ShardedOptimizer::OffloadStepBucket(int b, double grad_scale) {
  BucketState& s = *buckets_[b];
  const sched::Bucket& bk = reducer_->plan().buckets()[b];
  const size_t bytes = s.n * DTypeSize(bk.dtype);
  BufferOps& mem = ops();
  const auto named = [&](const absl::Status& st) {
    return absl::Status(st.code(),
                        absl::StrCat("offloaded optimizer step of ", s.label, " (group '",
                                     reducer_->groups().shard->name(), "'): ", st.message()));
  };
  // Device -> host after the reduction's last device operation (hybrid: on the replica
  // group's stream). The Synchronize is the step's one host wait; it also covers the previous
  // step's copy out of param_host, which is rewritten below.
  absl::Status st = mem.WaitFor(reducer_->BucketWork(b)->device_event());
  if (st.ok()) st = mem.Copy(s.grad_host.get(), reducer_->ShardView(b).data, bytes);
  if (st.ok()) st = mem.Synchronize(absl::Now() + config_.timeout);
  if (!st.ok()) return named(st);
  HostStep(b, s.grad_host.get(), s.param_host.get(), grad_scale);
  // Host -> the gatherer's device shard, queued; Publish records the step's event after it.
  st = mem.Copy(gatherer_->ShardView(b)->data, s.param_host.get(), bytes);
  return st.ok() ? st : named(st);
}

}  // namespace braid::optim
