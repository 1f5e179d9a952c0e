// GlobalNorm: one global gradient norm, and so one clip / skip decision, over the shards of
// several ShardedOptimizers, each over its own reducer and groups (a MoE model: dense
// parameters reduce-scattered over the data-parallel group, experts over their
// expert-data-parallel group; tensor-parallel shards over the data-parallel group of their
// tensor-parallel rank). As Megatron-LM's get_grad_norm_fp32: every element is counted once,
// then one all-reduce of 2 doubles over a group that spans every rank holding a shard.
//
//   ASSIGN_OR_RETURN(auto norm, GlobalNorm::Create(world, tp_group, {{dense.groups()},
//                                                                    {expert.groups()}}, ...));
//   cfg.global_norm = norm; cfg.norm_member = 0;   // then 1 for the expert optimizer
//
// Counting: member m's shard sum of squares counts on this rank when it is m's replica 0
// (hybrid replicas hold the same shard) and, for a member marked tp_replicated (parameters
// identical on every tensor-parallel rank and reduced without it, like Megatron's layer norms),
// on tensor-parallel rank 0. Ranks in different expert groups or tensor-parallel ranks hold
// distinct parameters: each counts its own, and the span's sum adds them.
// Contract: Create is collective over `span` (one Split). Every member calls Combine once per
// armed step, from any thread (a member's stepper); the last to arrive all-reduces, so every
// member of every rank must step the same rounds (the members share one OptimizerConfig and
// overlap). The deadline is the caller's; a member that does not arrive fails the others.
#ifndef BRAID_OPTIM_GLOBAL_NORM_H_
#define BRAID_OPTIM_GLOBAL_NORM_H_

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "optim/norm_agreement.h"
#include "optim/optimizer_options.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/memory_stats.h"

namespace braid::optim {

class GlobalNorm;

// ShardedOptimizer::Create's check of config.global_norm / norm_member (OK without one).
absl::Status CheckGlobalNormConfig(const OptimizerConfig& config);

class GlobalNorm {
 public:
  struct Member {
    sched::ReducerGroups groups;  // the member reducer's shard (and replica) group
    bool tp_replicated = false;   // counted on tensor-parallel rank 0 only
  };
  // `span`: every rank of every member (usually the world); `tensor_parallel` (may be null)
  // only names this rank's tensor-parallel rank. `on_device`: the all-reduce runs in device
  // memory (the members' buckets are device memory).
  static absl::StatusOr<std::shared_ptr<GlobalNorm>> Create(Group& span, Group* tensor_parallel,
                                                            std::vector<Member> members,
                                                            bool on_device,
                                                            sched::MemoryStats* memory);
  GlobalNorm(const GlobalNorm&) = delete;
  GlobalNorm& operator=(const GlobalNorm&) = delete;

  int members() const { return static_cast<int>(slots_.size()); }
  bool counted(int member) const { return slots_.at(member).counted; }
  const std::string& name() const { return agreement_->group().name(); }

  // Member `member`'s {sum of squares of its shards, 1 if it failed} in, the span's totals out
  // (uncounted sums add nothing; failures are this rank's max over members, summed over ranks).
  absl::Status Combine(int member, double* sumsq, double* failed, absl::Time deadline);

 private:
  struct Slot {
    bool counted = true;
    uint64_t seq = 0;  // Combine calls so far
    double sumsq = 0;
    double failed = 0;
  };
  struct Result {
    uint64_t seq = 0;
    double sumsq = 0;
    double failed = 0;
    absl::Status status;
  };
  GlobalNorm() = default;

  std::unique_ptr<NormAgreement> agreement_;  // its Split of the span and its Sum2
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;  // guarded by mu_
  Result result_;            // guarded by mu_: the latest completed all-reduce
};

}  // namespace braid::optim

#endif  // BRAID_OPTIM_GLOBAL_NORM_H_
