// CommHook: replaces the collective a GradientReducer issues for a bucket (torch DDP's
// register_comm_hook): it receives the bucket and returns a future of its reduced result, so a
// framework can change what a bucket sends (a low-precision wire, int8, low rank).
//
//   ASSIGN_OR_RETURN(auto hook, MakeLowPrecisionHook({DType::kBF16}));
//   RETURN_IF_ERROR(reducer->SetCommHook(hook));   // collective, between backwards
//
// RANK-ORDER CONTRACT: Run is called in bucket order on every rank (under the reducer's launch
// lock, where the default collective would be issued), so collectives a hook issues on
// `bucket.group` keep the group's order. Run must not block on peers; a later phase issued from
// a completion callback (PowerSGD's second all-reduce) would race other buckets' launches, so it
// needs a group of its own and bucket order kept there. SetCommHook verifies that every rank
// registered the same hook with the same Options(); a mismatch fails on every rank.
//
// Contract of Run: read `send`, never write it (a failed hook leaves the bucket's gradients
// intact, so the step can be retried without it); return a CommResult whose `work` completes
// when `data` holds the group's AVERAGE of this rank's part (the hook divides, as torch's hooks
// do): `count` elements of a floating dtype, which the reducer casts into the bucket. A Run
// error, a failed work, or a result of the wrong size or dtype fails the bucket with an error
// naming the bucket and the hook. Per-bucket state (error feedback, warm starts) lives in the
// hook, keyed by (bucket, stage); bucket indices and sizes change only with a re-plan, which
// calls OnReplan with the new layout's fingerprint (BucketPlan::Fingerprint(); CommAttach
// carries the layout's at registration), so a hook knows which layout its records follow. What
// counts steps is hook-wide, as torch's PowerSGDState.iter (advanced at the bucket with is_last()):
// CommBucket::last marks a step's last bucket, and a re-plan keeps the count (torch's bucket
// rebuild does not reset its hooks' step counts either). Host memory only (device reducers refuse a
// hook). A hook bypasses the OpScheduler.
#ifndef BRAID_SCHEDULER_COMM_HOOK_H_
#define BRAID_SCHEDULER_COMM_HOOK_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/dtype.h"
#include "comm/group.h"
#include "comm/work.h"
#include "scheduler/bucket_plan.h"
#include "scheduler/plan_check.h"

namespace braid::sched {

// Which collective of the reducer a hook replaces.
enum class CommStage {
  kAllReduce,         // all-reduce mode
  kReduceScatter,     // reduce-scatter mode, and the shard stage of hybrid
  kReplicaAllReduce,  // hybrid: the all-reduce of the shard across replicas
};
absl::string_view CommStageName(CommStage stage);  // "allreduce", "reduce_scatter", ...

// A parameter of an all-reduce bucket, for hooks that work per parameter (PowerSGD).
struct CommParam {
  int index = 0;      // registration order number (BucketPlan::params())
  size_t offset = 0;  // elements from the start of the bucket
  size_t count = 0;
};

struct CommBucket {
  int index = 0;  // the bucket
  CommStage stage = CommStage::kAllReduce;
  Group* group = nullptr;
  // all-reduce stages: `count` elements; reduce-scatter: group->size() * count, this rank's
  // result being block group->rank().
  const void* send = nullptr;
  size_t count = 0;  // elements of this rank's result (NCCL's count / recvcount)
  DType dtype = DType::kF32;
  CollectiveOptions options;      // its label names the bucket and the hook
  std::vector<CommParam> params;  // kAllReduce: the bucket's parameters, in bucket order
  // The plan's last bucket (torch's GradBucket::is_last()): the last Run of this stage in a
  // step, since Run follows bucket order.
  bool last = false;
};

// What SetCommHook hands a hook on every rank once the ranks agreed on it (CommHook::Attach).
struct CommAttach {
  Group* group = nullptr;  // the reducer's shard group (the all-reduce group in all-reduce mode)
  const std::vector<ParamSpec>* params = nullptr;  // the reducer's, in registration order
  absl::Duration timeout;
  // The bucket layout now (BucketPlan::Fingerprint()): what per-bucket state is saved under,
  // and what a loaded state's layout is compared with. Later layouts come with OnReplan.
  uint64_t plan_fingerprint = 0;
};

struct CommResult {
  WorkPtr work;                // completes when `data` holds the average
  const void* data = nullptr;  // owned by the hook; valid until its next Run of this bucket
  DType dtype = DType::kF32;
  size_t count = 0;  // must equal CommBucket::count
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual const std::string& name() const = 0;  // "bf16", "powersgd", ... (names it in errors)
  // What every rank must register alike (agreed at SetCommHook), besides the name.
  virtual std::vector<NamedOption> Options() const { return {}; }
  // Stages it replaces (the others run the default collective). Default: every stage.
  virtual bool Handles(CommStage stage) const { return true; }
  // Collective (SetCommHook calls it on every rank after the agreement): a hook that needs a
  // group of its own splits it here. An error fails SetCommHook (nothing is registered).
  virtual absl::Status Attach(const CommAttach& at) { return absl::OkStatus(); }
  virtual absl::StatusOr<CommResult> Run(const CommBucket& bucket) = 0;
  // The reducer's buckets changed (a re-plan: indices, sizes and contents move): drop per-bucket
  // state that follows elements (error feedback, warm-start Q); keep what is hook-wide (step
  // counts, the random draws' position), as torch's hooks do across torch's rebuild. Called
  // between backwards with no Run in flight, and only when the bucket layout changed (a rebuild
  // that yields the same buckets keeps the state); `plan_fingerprint` is the new layout's.
  virtual void OnReplan(uint64_t plan_fingerprint) {}
  // Checkpoints (scheduler/hooks/hook_state.h), between backwards with no Run in flight: this
  // rank's state as bytes ("" for a stateless hook), and those bytes loaded back into a hook
  // attached with the same options, so that the next steps are those of an uninterrupted run.
  // LoadState refuses another hook's, group size's or rank's state by name; an empty string
  // clears the state (the hook starts afresh).
  // BUCKET LAYOUT: the bytes record the layout's fingerprint the per-bucket records were saved
  // under. Hook-wide state (step and draw counts) loads whatever the layout. Per-bucket records
  // of the current layout load (the next Run of each bucket takes its record); those of another
  // layout are never applied to the current buckets: they wait, PENDING, for at most one step
  // run in the current layout. The re-plan after it installs them if it produces the saved
  // layout (a resume under torch's rebuild policy: the first step runs in the registration-order
  // layout, the one-time rebuild then moves to the layout the state was saved in); a re-plan to
  // any other layout drops them, and so does the first Run of a second step without a re-plan
  // (a rebuild that kept the buckets, or none). Meanwhile the buckets run without per-bucket
  // state, as after a re-plan. SaveState while records are pending saves those, under their
  // layout (a checkpoint taken right after a load keeps them), not the current layout's.
  virtual absl::StatusOr<std::string> SaveState() const { return std::string(); }
  virtual absl::Status LoadState(absl::string_view bytes) {
    if (bytes.empty()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("the '", name(), "' comm hook keeps no state, but state was given"));
  }
};

// Collective over `group`: every rank's hook (null: none) has the same name and options; else
// FailedPrecondition on every rank naming the hook and what differs.
absl::Status VerifyCommHookAcrossRanks(const CommHook* hook, Group& group, absl::Duration timeout);

// `st` (from a hook of bucket `label`) named with the bucket and the hook.
absl::Status CommHookError(absl::string_view label, const CommHook& hook, CommStage stage,
                           const absl::Status& st);

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_COMM_HOOK_H_
