// UsedMap: a GradientReducer's per-step agreement on which parameters some rank used (torch
// DDP's find_unused_parameters local_used_map): one int32 sum all-reduce of a 0/1 map, one
// element per parameter, over the shard group (hybrid: then the replica group). Each rank's
// local bit is 1 for a parameter it marked in this backward or in the no_sync /
// reduce_scatter_only microbatches of the window before it; declared-unused parameters are 0.
//
//   UsedMap used(plan, groups, config);          // config.agree_unused != kNone
//   used.Begin(SyncMode::kSync);
//   used.NoteMarked(i);                          // every mark, any thread
//   RETURN_IF_ERROR(used.IssueDeclared(declared));  // kDeclared: before any bucket launches
//   ... every bucket of the backward completed ...
//   RETURN_IF_ERROR(used.Finish(deadline));      // issues the rest, waits; the map is set
//   bool some_rank_used = used.used(i);
//
// RANK-ORDER CONTRACT (scheduler/reducer_stages.h): kDeclared issues the shard-group all-reduce
// before the backward's first bucket launches, so it is that group's first collective of the
// backward on every rank (and overlaps the backward); kAtFinish and kDeclaredAtFinish issue it
// after every bucket completed (the latter from the marks alone: a parameter neither declared
// nor marked is unused). The replica-group all-reduce (hybrid) always follows every replica
// stage of the backward, at Finish. static_graph: only the first synced backward agrees, at
// Finish on the marks (kDeclared too: a parameter neither declared nor marked is unused, as in
// torch's first static iteration); later ones keep its map and issue nothing.
// Contract: work() completes once the agreed map is readable (host groups, kDeclared, not
// hybrid: as soon as the all-reduce completed; else at Finish). used() is valid after that.
#ifndef BRAID_SCHEDULER_USED_MAP_H_
#define BRAID_SCHEDULER_USED_MAP_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "comm/buffer_ops.h"
#include "comm/work.h"
#include "scheduler/bucket_plan.h"
#include "scheduler/reducer_config.h"

namespace braid::sched {

class UsedMap {
 public:
  // `plan` is the reducer's (its address stays, its contents change at re-plans: Remap).
  UsedMap(const BucketPlan& plan, const ReducerGroups& groups, const ReducerConfig& config);
  ~UsedMap();
  UsedMap(const UsedMap&) = delete;
  UsedMap& operator=(const UsedMap&) = delete;

  // A backward begins: a synced one that agrees gets a fresh work().
  void Begin(SyncMode mode);
  // Parameter index i was marked ready (any thread, any sync mode).
  void NoteMarked(int i) { window_[i].store(1, std::memory_order_relaxed); }
  // kDeclared, a synced backward: `declared[i]` != 0 for the parameters this rank will not
  // mark. Issues the shard-group all-reduce now (nothing under static_graph after the first).
  absl::Status IssueDeclared(const std::vector<uint8_t>& declared);
  // End of a synced backward whose buckets all completed: issues what is left (kAtFinish: the
  // whole agreement; hybrid: the replica all-reduce), waits until `deadline`, sets the map and
  // completes work(). Clears the window. A backward that failed passes `issue` = false: nothing
  // more is issued and work() completes with Aborted.
  absl::Status Finish(absl::Time deadline, bool issue);
  // Not synced: the window goes on (a no_sync / reduce_scatter_only microbatch).
  bool agrees_now() const { return agreeing_; }
  // agree_unused is on (work() exists after the first synced BeginBackward).
  bool agrees() const { return config_.agree_unused != UnusedAgreement::kNone; }
  WorkPtr work() const { return agreed_; }
  // Index i (the plan's): some rank used it in the last agreed step.
  bool used(int i) const;
  const uint8_t* map() const;
  // The plan changed (re-plan / rebuild): the window's bits follow their parameters.
  void Remap(const BucketPlan& old_plan);

 private:
  struct State;  // shared with the all-reduce's completion callback
  absl::Status IssueShard(const std::vector<int32_t>& local);  // records a failure
  absl::Status IssueShardImpl(const std::vector<int32_t>& local);

  const BucketPlan& plan_;
  const ReducerGroups groups_;
  const ReducerConfig& config_;
  BufferOps& ops_;  // the shard group's
  std::unique_ptr<std::atomic<uint8_t>[]> window_;
  size_t window_size_ = 0;
  std::shared_ptr<State> state_;
  bool agreeing_ = false;  // this backward agrees
  bool agreed_once_ = false;
  bool issued_ = false;       // the shard all-reduce of this backward was (tried to be) issued
  absl::Status issue_error_;  // why that failed (then shard_work_ is null)
  WorkPtr shard_work_;        // that all-reduce
  WorkPtr agreed_;            // completes when the map is readable
  OwnedBuffer device_;        // device groups: the map's int32 counts
};

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_USED_MAP_H_
