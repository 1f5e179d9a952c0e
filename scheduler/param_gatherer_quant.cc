// ParamGatherer's quantized all-gathers (GathererConfig::quant, ZeRO++'s qwZ): each rank sends
// its shard as one record of scales and 1-byte codes (scheduler/gather_quant.h); once the
// records are in, every rank's record is dequantized into its block of the full buffer, and only
// then does the gather's Work complete, so WaitParams, GatherWork and the unit scheduler see
// finished values. The staging records are counted as kStaging while a gather is in flight.
// Host groups encode and decode on the calling / completing thread. Device groups run the cast
// gathers (bf16 / f16) only, as three steps queued in order on the group's stream through its
// BufferOps: narrow the shard into this rank's record (CastScale f32 -> wire dtype), the
// in-place all-gather of the records, widen all records into the full buffer (one CastScale:
// records and blocks are both rank-major); the host never waits in between. Their records
// live in one device buffer per gatherer (the largest bucket's, kStaging, freed with the
// gatherer), reused in stream order.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "scheduler/param_gatherer.h"

namespace braid::sched {

absl::Status ParamGatherer::CheckQuant(const BucketPlan& plan, Group& group,
                                       const GathererConfig& config) {
  const GatherQuant& q = config.quant;
  if (q.dtype == GatherDType::kExact) return absl::OkStatus();
  const std::string what =
      absl::StrCat("param gatherer: quantized gathers (", GatherDTypeName(q.dtype), ")");
  if (q.block < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": quant.block is ", q.block, "; at least 1 element per scale"));
  }
  if (!config.fully_sharded) {
    return absl::InvalidArgumentError(absl::StrCat(
        what,
        " are for fully sharded parameters (fully_sharded = true): without it the shard "
        "lives inside the gathered buffer the optimizer writes"));
  }
  if (!group.buffer_ops().synchronous() && !IsCastGather(q.dtype)) {
    return absl::UnimplementedError(absl::StrCat(
        what, " run on host groups; group '", group.name(), "' (backend ", group.backend_name(),
        ") queues on a device stream, where only the bf16 / f16 casts run"));
  }
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bk = plan.buckets()[b];
    if (bk.dtype != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": bucket ", b, " (first parameter ", plan.params()[bk.params[0]].Label(), ") is ",
          DTypeName(bk.dtype), "; only f32 parameters are quantized"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkPtr> ParamGatherer::LaunchQuantizedLocked(int b, char* full, DeviceEvent ready) {
  if (!group_->buffer_ops().synchronous()) return LaunchCastOnDeviceLocked(b, full, ready);
  const Bucket& bk = plan_.buckets()[b];
  const GatherQuant q = config_.quant;
  const size_t count = bk.shard_count;
  const size_t record = QuantRecordBytes(q, count);
  const int n = group_->size();
  const std::string label = absl::StrCat("bucket ", b);
  ASSIGN_OR_RETURN(OwnedBuffer staging,
                   CountedAllocate(config_.memory, group_->buffer_ops(), record * n,
                                   MemoryUse::kStaging, label + " (quantized gather)"));
  auto records = std::make_shared<OwnedBuffer>(std::move(staging));
  uint8_t* all = reinterpret_cast<uint8_t*>(records->get());
  uint8_t* mine = all + record * static_cast<size_t>(group_->rank());
  QuantizeBlocks(q, reinterpret_cast<const float*>(ShardData(b)), count, mine);
  CollectiveOptions opts;
  opts.label = label;
  ASSIGN_OR_RETURN(WorkPtr gather, group_->AllGather(mine, all, record, DType::kU8, opts));
  WorkPtr done = Work::Create(WorkInfo{group_->name(), "quantized allgather", 0, label});
  float* out = reinterpret_cast<float*>(full);
  gather->OnComplete([records, done, out, q, count, record, n](const absl::Status& st) mutable {
    if (st.ok()) {
      const uint8_t* recs = reinterpret_cast<const uint8_t*>(records->get());
      for (int r = 0; r < n; ++r) DequantizeBlocks(q, recs + record * r, count, out + count * r);
    }
    records.reset();  // before `done`: once it completes the gatherer (and its memory) may go
    done->Complete(st);
  });
  return done;
}

absl::StatusOr<WorkPtr> ParamGatherer::LaunchCastOnDeviceLocked(int b, char* full,
                                                                DeviceEvent ready) {
  const Bucket& bk = plan_.buckets()[b];
  const DType wire = config_.quant.dtype == GatherDType::kBF16 ? DType::kBF16 : DType::kF16;
  const size_t count = bk.shard_count;
  const size_t record = count * DTypeSize(wire);
  const size_t n = static_cast<size_t>(group_->size());
  BufferOps& ops = group_->buffer_ops();
  if (!cast_records_) {
    // One buffer for every cast gather: they run one after another on the group's stream, so a
    // gather's narrowing cast is queued after the previous one's widening read its records.
    size_t largest = 0;
    for (const Bucket& k : plan_.buckets()) largest = std::max(largest, k.shard_count);
    ASSIGN_OR_RETURN(
        cast_records_,
        CountedAllocate(config_.memory, ops, largest * DTypeSize(wire) * n, MemoryUse::kStaging,
                        absl::StrCat(DTypeName(wire), " gather records")));
  }
  char* all = cast_records_.get();
  char* mine = all + record * static_cast<size_t>(group_->rank());
  RETURN_IF_ERROR(ops.WaitFor(ready));  // a producer of the shard (the optimizer's step)
  RETURN_IF_ERROR(ops.CastScale(ShardData(b), DType::kF32, mine, wire, count, ScaleSpec{}));
  const std::string label = absl::StrCat("bucket ", b);
  CollectiveOptions opts;
  opts.label = label;
  ASSIGN_OR_RETURN(WorkPtr gather, group_->AllGather(mine, all, count, wire, opts));
  WorkPtr done =
      Work::Create(WorkInfo{group_->name(), absl::StrCat(DTypeName(wire), " allgather"), 0, label});
  // The all-gather is issued on every rank: from here a failure is this gather's (its Work
  // fails), not the launch's.
  absl::Status st = ops.CastScale(all, wire, full, DType::kF32, count * n, ScaleSpec{});
  // `done` completes (its device event: after the widening) once the stream has run past the
  // widening, or at once with the all-gather's error: the first completion wins.
  if (st.ok()) st = ops.CompleteAfter(done, absl::Now() + config_.timeout);
  if (!st.ok()) {
    done->Complete(WithContext(st, absl::StrCat("widening the ", DTypeName(wire), " records")));
    return done;
  }
  gather->OnComplete([done](const absl::Status& gs) {
    if (!gs.ok()) done->Complete(gs);
  });
  return done;
}

}  // namespace braid::sched
