// What each C handle stands for. Every object keeps the objects it uses alive through
// shared_ptr (so a call in flight on another thread never sees them freed), and the registry's
// parent/child counts (handles.h) make destroy order explicit for the caller.
#ifndef BRAID_CAPI_IMPL_H_
#define BRAID_CAPI_IMPL_H_

#include <memory>
#include <mutex>
#include <string>

#include "capi/braid.h"
#include "capi/handles.h"
#include "comm/backend.h"
#include "comm/group.h"
#include "comm/work.h"
#include "optim/training_stack.h"
#include "scheduler/join.h"

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

// A reducer handle: the rank's training stack (optim/training_stack.h), its reducer side.
struct ReducerImpl {
  using Handle = braid_reducer_t;
  static constexpr Tag kTag = Tag::kReducer;
  std::shared_ptr<GroupImpl> shard, replica;  // replica may be null; outlive the stack
  std::unique_ptr<optim::TrainingStack> stack;
  // An open join (capi/join_capi.cc), destroyed before the stack it drives.
  std::unique_ptr<sched::Join> join;
  sched::JoinStep join_step;  // its last agreement
  bool joined = false;        // that agreement was a joined rank's
  // The registered comm hook's name (braid_reducer_set_comm_hook; empty: none). A hook averages
  // over its group's size, so it cannot follow join's divide by the contributing ranks.
  std::string comm_hook;
  // The hook itself (null: none), for its checkpoint state (comm_hook_state_capi.cc).
  std::shared_ptr<braid::sched::CommHook> comm_hook_object;
};

// An optimizer handle: the parameter side of its reducer's stack (gatherer, optimizer, units),
// installed by braid_optimizer_create and dropped with the handle.
struct OptimizerImpl {
  using Handle = braid_optimizer_t;
  static constexpr Tag kTag = Tag::kOptimizer;
  ~OptimizerImpl();
  optim::TrainingStack& stack() const { return *reducer->stack; }
  optim::ShardedOptimizer& opt() const { return *stack().optimizer(); }
  std::shared_ptr<ReducerImpl> reducer;
  optim::OptimizerKind kind = optim::OptimizerKind::kAdamW;  // whose hyper-parameters count
  bool attached = false;  // the parameter side is installed (the destructor drops it)
};

// The optimizer of handle `opt`; FailedPrecondition when a failed re-plan left it without one,
// or the handle gathers only (BRAID_OPTIMIZER_NONE).
absl::StatusOr<std::shared_ptr<OptimizerImpl>> FindOptimizer(const void* opt);
// The handle `opt` for its parameter side (gathers, units, backwards): gather-only handles too.
absl::StatusOr<std::shared_ptr<OptimizerImpl>> FindParamSide(const void* opt);

// Holds the mutexes of a reducer's groups (shard, and replica if any) for a collective call on
// them, so no other C API call on those groups interleaves.
class GroupLocks {
 public:
  explicit GroupLocks(ReducerImpl& r);

 private:
  std::unique_lock<std::mutex> shard_, replica_;
};

}  // namespace braid::capi

#endif  // BRAID_CAPI_IMPL_H_
