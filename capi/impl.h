// What each C handle stands for. Every object keeps the objects it uses alive through
// shared_ptr (so a call in flight on another thread never sees them freed), and the registry's
// parent/child counts (handles.h) make destroy order explicit for the caller.
#ifndef BRAID_CAPI_IMPL_H_
#define BRAID_CAPI_IMPL_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "capi/braid.h"
#include "capi/handles.h"
#include "comm/backend.h"
#include "comm/group.h"
#include "comm/work.h"
#include "optim/sharded_optimizer.h"
#include "scheduler/autotuner.h"
#include "scheduler/buffer_pool.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/memory_stats.h"
#include "scheduler/op_scheduler.h"
#include "scheduler/param_gatherer.h"
#include "scheduler/timeline.h"
#include "scheduler/unit_scheduler.h"

namespace braid::capi {

struct WorldImpl {
  using Handle = braid_world_t;
  static constexpr Tag kTag = Tag::kWorld;
  std::unique_ptr<Backend> backend;
  std::string backend_name;  // backend->name(), kept for braid_world_backend's pointer
};

struct GroupImpl {
  using Handle = braid_group_t;
  static constexpr Tag kTag = Tag::kGroup;
  braid_world_t* world = nullptr;  // the world it came from (a token: compared, never used)
  int world_rank = 0;              // the world rank this group object plays
  std::mutex mu;                   // serializes collectives and splits on `group`
  std::unique_ptr<Group> group;
};

struct WorkImpl {
  using Handle = braid_work_t;
  static constexpr Tag kTag = Tag::kWork;
  std::shared_ptr<GroupImpl> group;  // the group outlives the work's handle
  WorkPtr work;
};

struct OptimizerImpl;

struct ReducerImpl {
  using Handle = braid_reducer_t;
  static constexpr Tag kTag = Tag::kReducer;
  std::shared_ptr<GroupImpl> shard, replica;  // replica may be null
  int device = BRAID_DEVICE_HOST;             // braid_reducer_options_t.device
  bool shard_gradients = false;               // braid_reducer_options_t.shard_gradients
  std::unique_ptr<sched::Timeline> timeline;  // outlives the reducer (declared before it)
  // Counts the reducer's, gatherer's and optimizer's buffers (braid_memory_stats); declared
  // before them so it outlives every counted buffer.
  std::unique_ptr<sched::MemoryStats> memory = std::make_unique<sched::MemoryStats>();
  // shard_gradients on the host: the pool its gradient storage shares with a fully sharded
  // optimizer's gathered parameters (scheduler/buffer_pool.h).
  std::shared_ptr<sched::BufferPool> pool;
  // credit_bytes / priorities (0.9): the launch scheduler of the reducer and of an optimizer's
  // gatherer built on it; declared before the reducer, so it outlives both.
  std::unique_ptr<sched::OpScheduler> scheduler;
  std::unique_ptr<sched::GradientReducer> reducer;
  // braid_reducer_autotune: created by its first call (the reducer's caps are the default);
  // first_cap is the reducer's first-bucket cap then (candidates keep it, at most their cap).
  std::unique_ptr<sched::Autotuner> tuner;
  size_t first_cap = 0;
  // Between a successful begin_backward (reducer's or optimizer's) and the next finish: the
  // C++ reducer does not expose it, and zero_grads must refuse then.
  std::atomic<bool> in_backward{false};
  // The optimizer built on this reducer, if any (re-plans carry its state over).
  std::weak_ptr<OptimizerImpl> optimizer;
};

struct OptimizerImpl {
  using Handle = braid_optimizer_t;
  static constexpr Tag kTag = Tag::kOptimizer;
  // Destroyed in reverse: optimizer, gatherer, gather group, then the reducer reference.
  std::shared_ptr<ReducerImpl> reducer;
  std::unique_ptr<Group> gather_group;
  std::unique_ptr<sched::ParamGatherer> gatherer;
  std::unique_ptr<optim::ShardedOptimizer> opt;
  // fully_sharded only: drives the gatherer unit by unit (destroyed first).
  std::unique_ptr<sched::UnitScheduler> units;
  // What it was created with: a re-plan of the reducer's buckets builds it again from them.
  braid_optimizer_options_t options{};
  optim::OptimizerConfig config;
  // The gatherer (and its group) of the plan before the last re-plan: kept until the next one
  // or the optimizer's end, so parameter pointers the framework still holds stay readable
  // until it fetched the new ones (braid_optimizer_param).
  std::unique_ptr<Group> retired_gather_group;
  std::unique_ptr<sched::ParamGatherer> retired_gatherer;
};

// Builds the gather group, gatherer, optimizer and (fully sharded) unit scheduler of `impl`
// (whose reducer is set): collective over the reducer's shard group.
absl::Status BuildOptimizer(OptimizerImpl& impl, const braid_optimizer_options_t& o,
                            const optim::OptimizerConfig& config);

// The optimizer of handle `opt`; FailedPrecondition when a failed re-plan left it without one.
absl::StatusOr<std::shared_ptr<OptimizerImpl>> FindOptimizer(const void* opt);

// A re-plan of r's buckets (braid_reducer_rebuild_buckets, braid_reducer_autotune): runs
// `replan` under r's group locks; with an optimizer built on r, carries it over: its whole state
// is gathered (ShardedOptimizer::GatherCheckpoint), it is built again over the new plan and loads
// this rank's part of that state (optim/reshard.h). Collective. Returns replan's result, or
// true whenever an optimizer was carried over (its parameter pointers changed either way).
absl::StatusOr<bool> ReplanCarryingOptimizer(ReducerImpl& r,
                                             const std::function<absl::StatusOr<bool>()>& replan);

// Bucket re-plans (braid_reducer_rebuild_buckets, braid_reducer_autotune): FAILED_PRECONDITION
// naming why `r` cannot re-plan now (an optimizer built on it, shard_gradients, a backward in
// progress).
absl::Status CheckReplannable(braid_reducer_t* handle, const ReducerImpl& r);

// Holds the mutexes of a reducer's groups (shard, and replica if any) for a collective call on
// them, so no other C API call on those groups interleaves.
class GroupLocks {
 public:
  explicit GroupLocks(ReducerImpl& r);
  // Unlocks early (the destructor then does nothing).
  void Release() {
    if (replica_.owns_lock()) replica_.unlock();
    if (shard_.owns_lock()) shard_.unlock();
  }

 private:
  std::unique_lock<std::mutex> shard_, replica_;
};

}  // namespace braid::capi

#endif  // BRAID_CAPI_IMPL_H_
