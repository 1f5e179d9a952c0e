#include "optim/norm_agreement.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "optim/norm_math.h"

namespace braid::optim {

absl::StatusOr<std::unique_ptr<NormAgreement>> NormAgreement::Create(
    Group& shard, bool on_device, bool device_norms, std::vector<OptimizerShard>& shards,
    sched::MemoryStats* memory) {
  std::unique_ptr<NormAgreement> a(new NormAgreement());
  a->on_device_ = on_device;
  BufferOps& mem = shard.buffer_ops();
  a->stats_.reset(new double[2]());
  if (on_device && device_norms) {
    size_t blocks = 0;
    for (OptimizerShard& s : shards) {
      s.norm_offset = blocks;
      for (const Segment& seg : s.segments) blocks += NormBlocks(seg.hi - seg.lo);
    }
    a->norm_host_.assign(blocks, 0.0);
    ASSIGN_OR_RETURN(a->norm_dev_, sched::CountedAllocate(
                                       memory, mem, std::max<size_t>(1, blocks) * sizeof(double),
                                       sched::MemoryUse::kStaging, "gradient norm block sums"));
  }
  if (on_device) {
    // Load's agreement all-reduces use it even without clipping.
    ASSIGN_OR_RETURN(a->stats_dev_, sched::CountedAllocate(memory, mem, 2 * sizeof(double),
                                                           sched::MemoryUse::kStaging,
                                                           "optimizer statistics all-reduce"));
  }
  ASSIGN_OR_RETURN(a->group_, shard.Split(0, shard.rank(), absl::StrCat(shard.name(), "/optim")));
  return a;
}

absl::Status NormAgreement::Sum2(Group& g, double* x, double* y, absl::Time deadline) {
  stats_[0] = *x;
  stats_[1] = *y;
  if (!on_device_) {
    absl::StatusOr<WorkPtr> w = g.AllReduce(stats_.get(), stats_.get(), 2, DType::kF64,
                                            ReduceOp::Sum(), CollectiveOptions{});
    RETURN_IF_ERROR(w.ok() ? (*w)->WaitUntil(deadline) : w.status());
  } else {
    // Device collectives take device memory: in through g's stream, summed there, and back.
    BufferOps& mem = g.buffer_ops();
    auto* dev = reinterpret_cast<double*>(stats_dev_.get());
    const size_t bytes = 2 * sizeof(double);
    RETURN_IF_ERROR(mem.Copy(dev, stats_.get(), bytes));
    ASSIGN_OR_RETURN(WorkPtr w,
                     g.AllReduce(dev, dev, 2, DType::kF64, ReduceOp::Sum(), CollectiveOptions{}));
    RETURN_IF_ERROR(w->WaitUntil(deadline));
    RETURN_IF_ERROR(mem.WaitFor(w->device_event()));
    RETURN_IF_ERROR(mem.Copy(stats_.get(), dev, bytes));
    RETURN_IF_ERROR(mem.Synchronize(deadline));
  }
  *x = stats_[0];
  *y = stats_[1];
  return absl::OkStatus();
}

absl::Status NormAgreement::QueueDeviceNorm(DeviceStepKernels& kernels, const OptimizerShard& shard,
                                            DType dtype, const char* grad, BufferOps& ops,
                                            DeviceEvent reduced, const std::string& group_name) {
  auto* sums = reinterpret_cast<double*>(norm_dev_.get());
  absl::Status st = ops.WaitFor(reduced);
  size_t at = shard.norm_offset;
  for (size_t k = 0; k < shard.segments.size() && st.ok(); ++k) {
    const Segment& seg = shard.segments[k];
    st = kernels.NormBlockSums(grad + seg.lo * DTypeSize(dtype), dtype, seg.hi - seg.lo, sums + at,
                               ops.stream());
    at += NormBlocks(seg.hi - seg.lo);
  }
  if (!st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("gradient norm of ", shard.label, " on the stream of group '",
                                     group_name, "': ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status NormAgreement::FetchDeviceNorms(BufferOps& ops, absl::Time deadline) {
  absl::Status synced =
      ops.Copy(norm_host_.data(), norm_dev_.get(), norm_host_.size() * sizeof(double));
  if (synced.ok()) synced = ops.Synchronize(deadline);
  return synced;
}

double NormAgreement::DeviceSquaredNorm(const OptimizerShard& shard) const {
  double sum = 0;
  size_t at = shard.norm_offset;
  for (const Segment& seg : shard.segments) {
    const size_t blocks = NormBlocks(seg.hi - seg.lo);
    sum += NormSumBlocks(norm_host_.data() + at, blocks);  // SquaredNormF64 of the segment
    at += blocks;
  }
  return sum;
}

double NormAgreement::ClipScale(double max_norm, double norm) {
  return std::min(1.0, max_norm / (norm + 1e-6));
}

}  // namespace braid::optim
