#include "optim/host_step.h"

#include <vector>

#include "optim/adamw_kernel.h"

namespace braid::optim {

void HostStep(KernelPool& pool, OptimizerShard& shard, const ShardStepArgs& args) {
  const size_t es = DTypeSize(args.dtype);
  std::vector<StepRun> whole;
  if (args.runs == nullptr) {
    for (const Segment& s : shard.segments) whole.push_back({s.lo, s.hi, s.group, shard.steps});
  }
  for (const StepRun& seg : args.runs != nullptr ? *args.runs : whole) {
    const GroupHyper& h = (*args.hyper)[seg.group];
    const size_t n = seg.hi - seg.lo;
    const char* g = args.grad + seg.lo * es;
    char* o = args.out + seg.lo * es;
    if (args.kind == OptimizerKind::kAdamW) {
      AdamWParallel(pool, StepScalars(h.adamw, seg.steps, args.grad_scale),
                    shard.master.get() + seg.lo, shard.m.get() + seg.lo, shard.v.get() + seg.lo, g,
                    args.dtype, n, o, args.dtype);
    } else {
      SgdParallel(
          pool, SgdStepScalars(h.sgd, seg.steps, args.grad_scale), shard.master.get() + seg.lo,
          h.sgd.momentum != 0 ? shard.m.get() + seg.lo : nullptr, g, args.dtype, n, o, args.dtype);
    }
  }
}

double HostSquaredNorm(KernelPool& pool, const OptimizerShard& shard, DType dtype,
                       const char* grad) {
  double sum = 0;
  for (const Segment& seg : shard.segments) {
    sum += SquaredNormF64(pool, grad + seg.lo * DTypeSize(dtype), dtype, seg.hi - seg.lo);
  }
  return sum;
}

}  // namespace braid::optim
