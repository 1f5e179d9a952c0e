// ReducerConfig: what a GradientReducer (scheduler/gradient_reducer.h) is built from: the
// reduction mode, bucket caps, gradient storage and the optional timeline, memory counter and
// launch scheduler. Apart from the class so that the reducer's parts (its bucket storage and
// launch stages) read the options without including the reducer.
//
//   ReducerConfig cfg;
//   cfg.mode = ReduceMode::kReduceScatter;
//   cfg.shard_gradients = true;  // FSDP's gradient memory: pooled buckets, kept shards
//   ASSIGN_OR_RETURN(auto reducer, GradientReducer::Create(params, {group}, cfg));
//
// Contract: options are read once, at Create (bucket caps change only through Replan, the
// scheduler through SetScheduler). The pointers are not owned and must outlive the reducer.
// Option names match the C API's braid_reducer_options_t fields where both have one.
#ifndef BRAID_SCHEDULER_REDUCER_CONFIG_H_
#define BRAID_SCHEDULER_REDUCER_CONFIG_H_

#include <cstddef>
#include <memory>

#include "absl/time/time.h"
#include "comm/dtype.h"
#include "comm/group.h"
#include "scheduler/buffer_pool.h"
#include "scheduler/memory_stats.h"
#include "scheduler/op_scheduler.h"
#include "scheduler/timeline.h"

namespace braid::sched {

enum class ReduceMode { kAllReduce, kReduceScatter, kHybrid };
enum class SyncMode { kSync, kNoSync, kReduceScatterOnly };
// Which parameters some rank used in a synced backward (scheduler/used_map.h): not agreed;
// agreed at FinishBackward; or agreed as the backward's first collective from the set each rank
// declares up front (GradientReducer::DeclareUnused, every synced backward on every rank);
// or declared up front (zero-filled early) but agreed at FinishBackward on what was marked, so
// a parameter neither declared nor marked is unused (torch's reached-but-no-gradient).
enum class UnusedAgreement { kNone, kAtFinish, kDeclared, kDeclaredAtFinish };
// The framework declares the parameters it will not mark (DeclareUnused) in every backward.
inline bool Declares(UnusedAgreement a) {
  return a == UnusedAgreement::kDeclared || a == UnusedAgreement::kDeclaredAtFinish;
}

struct ReducerGroups {
  Group* shard = nullptr;    // all-reduce mode: the data-parallel group; else reduce-scatter group
  Group* replica = nullptr;  // hybrid mode only: the group that all-reduces each shard
};

struct ReducerConfig {
  ReduceMode mode = ReduceMode::kAllReduce;
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t first_bucket_cap_bytes = size_t{1} << 20;
  bool allow_unused = false;  // unmarked parameters are zero-filled and reduced, not an error
  // Agree each synced backward on which parameters some rank used (GradientReducer::Used; a
  // sharded optimizer skips the others, as torch's skips a None grad). Implies allow_unused.
  UnusedAgreement agree_unused = UnusedAgreement::kNone;
  // With agree_unused: the graph is the same every step (torch DDP's static_graph): only the
  // first synced backward agrees, later ones reuse its map and communicate nothing more.
  bool static_graph = false;
  // true (default): gradients are bucket views (zero copy). false: the framework keeps its own
  // gradient buffers (SetGradBuffer); MarkReady packs each into its bucket, and in all-reduce
  // mode the averaged result is unpacked back as each bucket completes.
  bool gradient_as_bucket_view = true;
  // Reduce bf16/f16 gradients in this wider dtype (f32): each such bucket is widened into a
  // staging buffer when it is complete, every stage (collectives, divides, reduce_scatter_only
  // partials) runs there, and the result is rounded to the gradient dtype once at the end.
  // kF16/kBF16 (the default: no staging) or kF32.
  DType reduce_dtype = DType::kBF16;
  // Record the readiness order of the first synced backward; RebuildBucketsIfPending() then
  // rebuilds the buckets in world rank 0's order (DDP's one-time rebuild).
  bool rebuild_bucket_order = false;
  absl::Duration timeout = absl::Seconds(300);  // FinishBackward's deadline
  // Optional: marks, bucket launches, each collective's span on its group's row, and
  // FinishBackward's wait (see Timeline::FromOptions).
  Timeline* timeline = nullptr;
  // Optional: counts every buffer the reducer allocates (buckets, staging, partial sums).
  MemoryStats* memory = nullptr;
  // FSDP's gradient memory (reduce-scatter and hybrid modes only; InvalidArgument otherwise,
  // and with gradient_as_bucket_view = false or rebuild_bucket_order). Full-size bucket
  // storage exists only while a bucket is filled and reduced; what stays is one kept shard per
  // bucket (scheduler/reducer_storage.h). The C API's and braid.pytorch's name too.
  bool shard_gradients = false;
  // shard_gradients on host groups: full-size storage comes from and goes back to this pool,
  // shared with the parameter gatherer (scheduler/buffer_pool.h), instead of the reducer's own.
  // InvalidArgument at Create on device groups or without shard_gradients.
  std::shared_ptr<BufferPool> shared_pool;
  // shard_gradients: the most bytes the reducer's own pool of full-size storage may hold, in use
  // and free (0: no limit, the pool grows to what is in flight at once). At the limit, taking
  // storage waits for a launched reduction's storage to come back (up to `timeout`), stalling
  // the hand-over in MarkReady; it never waits for anything not yet launched
  // (scheduler/buffer_pool.h). With shared_pool the shared pool's own limit applies: this must
  // be 0 or equal to it. InvalidArgument at Create without shard_gradients, and at Allocate when
  // below one bucket's storage (and staging).
  int64_t pool_limit_bytes = 0;
  // Optional: every reduce-scatter / all-reduce goes through it (credit-sized partitions,
  // priorities; scheduler/op_scheduler.h), still submitted in bucket order. Results are bit for
  // bit those without it (see partition.h).
  OpScheduler* scheduler = nullptr;
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_REDUCER_CONFIG_H_
