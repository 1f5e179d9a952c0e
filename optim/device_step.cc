#include "optim/device_step.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace braid::optim {

absl::Status QueueDeviceStep(DeviceStepKernels& kernels, OptimizerShard& shard,
                             const ShardStepArgs& args, BufferOps& ops, DeviceEvent reduced,
                             const std::string& group) {
  // Queued on the shard group's stream after the reduction's last device operation (hybrid:
  // on the replica group's stream, so this wait is what orders the step after it).
  const size_t es = DTypeSize(args.dtype);
  absl::Status st = ops.WaitFor(reduced);
  std::vector<StepRun> whole;
  if (args.runs == nullptr) {
    for (const Segment& s : shard.segments) whole.push_back({s.lo, s.hi, s.group, shard.steps});
  }
  const std::vector<StepRun>& runs = args.runs != nullptr ? *args.runs : whole;
  for (size_t k = 0; k < runs.size() && st.ok(); ++k) {
    const StepRun& seg = runs[k];
    const GroupHyper& h = (*args.hyper)[seg.group];
    const size_t n = seg.hi - seg.lo;
    if (args.kind == OptimizerKind::kAdamW) {
      st = kernels.AdamW(StepScalars(h.adamw, seg.steps, args.grad_scale),
                         shard.master.get() + seg.lo, shard.m.get() + seg.lo,
                         shard.v.get() + seg.lo, args.grad + seg.lo * es, args.dtype, n,
                         args.out + seg.lo * es, args.dtype, ops.stream());
    } else {
      st = kernels.Sgd(
          SgdStepScalars(h.sgd, seg.steps, args.grad_scale), shard.master.get() + seg.lo,
          h.sgd.momentum != 0 ? shard.m.get() + seg.lo : nullptr, args.grad + seg.lo * es,
          args.dtype, n, args.out + seg.lo * es, args.dtype, ops.stream());
    }
  }
  if (!st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("optimizer step of ", shard.label, " on the stream of group '",
                                     group, "': ", st.message()));
  }
  return absl::OkStatus();
}

}  // namespace braid::optim
