// AllocateShards: every bucket's OptimizerShard of this rank, its state zeroed and counted.
#include "optim/optimizer_shard.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "scheduler/memory_stats.h"

namespace braid::optim {
namespace {

// n zeroed floats in `ops`' memory (device: the memset is queued on its stream, ahead of every
// step).
absl::StatusOr<FloatBuffer> ZeroedFloats(sched::MemoryStats* memory, BufferOps& ops, size_t n,
                                         const std::string& what) {
  const size_t bytes = std::max<size_t>(64, (n * sizeof(float) + 63) / 64 * 64);
  FloatBuffer f;
  ASSIGN_OR_RETURN(
      f.buf, sched::CountedAllocate(memory, ops, bytes, sched::MemoryUse::kOptimizerState, what));
  RETURN_IF_ERROR(ops.Zero(f.buf.get(), bytes));
  return f;
}

// An offload staging buffer: host memory from the device ops (pinned on a GPU), counted as host
// kStaging.
absl::StatusOr<OwnedBuffer> PinnedStaging(const OptimizerConfig& config, BufferOps& ops,
                                          size_t bytes, const std::string& what) {
  ASSIGN_OR_RETURN(OwnedBuffer b, ops.AllocateHost(bytes, what));
  if (config.memory == nullptr) return b;
  return config.memory->Adopt(std::move(b), /*device=*/false, sched::MemoryUse::kStaging);
}

}  // namespace

absl::StatusOr<std::vector<OptimizerShard>> AllocateShards(const sched::BucketPlan& plan, int rank,
                                                           const OptimizerConfig& config,
                                                           BufferOps& state_mem,
                                                           BufferOps* staging) {
  const size_t r = static_cast<size_t>(rank);
  std::vector<OptimizerShard> shards;
  shards.reserve(plan.buckets().size());
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const sched::Bucket& bk = plan.buckets()[b];
    OptimizerShard s;
    s.label = absl::StrCat("bucket ", b);
    s.n = bk.shard_count;
    ASSIGN_OR_RETURN(s.master, ZeroedFloats(config.memory, state_mem, s.n,
                                            absl::StrCat("optimizer master weights of ", s.label)));
    ASSIGN_OR_RETURN(s.m, ZeroedFloats(config.memory, state_mem, s.n,
                                       absl::StrCat("optimizer state of ", s.label)));
    if (config.kind == OptimizerKind::kAdamW) {
      ASSIGN_OR_RETURN(s.v, ZeroedFloats(config.memory, state_mem, s.n,
                                         absl::StrCat("optimizer state of ", s.label)));
    }
    if (staging != nullptr) {
      const size_t bytes = std::max<size_t>(1, s.n * DTypeSize(bk.dtype));
      ASSIGN_OR_RETURN(s.grad_host,
                       PinnedStaging(config, *staging, bytes,
                                     absl::StrCat("offload gradient staging of ", s.label)));
      ASSIGN_OR_RETURN(s.param_host,
                       PinnedStaging(config, *staging, bytes,
                                     absl::StrCat("offload parameter staging of ", s.label)));
    }
    const size_t start = r * bk.shard_count, end = start + bk.shard_count;
    s.skips.SetParams(bk.params.size());
    for (size_t k = 0; k < bk.params.size(); ++k) {
      const int pi = bk.params[k];
      const size_t off = plan.slot(pi).offset, lo = std::max(off, start),
                   hi = std::min(off + plan.params()[pi].count, end);
      if (lo >= hi) continue;
      auto it = config.group_of.find(plan.params()[pi].id);
      const int g = it == config.group_of.end() ? 0 : it->second;
      s.skips.AddPiece(static_cast<int>(k), lo - start, hi - start, g);
      if (!s.segments.empty() && s.segments.back().hi == lo - start &&
          s.segments.back().group == g) {
        s.segments.back().hi = hi - start;
      } else {
        s.segments.push_back(Segment{lo - start, hi - start, g});
      }
    }
    shards.push_back(std::move(s));
  }
  return shards;
}

}  // namespace braid::optim
