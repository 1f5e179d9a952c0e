// C API: re-planning a reducer's buckets between steps (braid_reducer_rebuild_buckets' checks,
// shared) and the autotuner (braid_reducer_autotune over scheduler/autotuner.h).
#include <algorithm>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/status_macros.h"
#include "optim/reshard.h"

namespace braid::capi {

absl::Status CheckReplannable(braid_reducer_t* handle, const ReducerImpl& r) {
  if (HandleRegistry::Get().Children(handle, Tag::kOptimizer) != 0) {
    const std::shared_ptr<OptimizerImpl> o = r.optimizer.lock();
    if (o == nullptr || o->options.fully_sharded == 1 || r.device != BRAID_DEVICE_HOST) {
      return absl::FailedPreconditionError(absl::StrCat(
          "an optimizer was built on this reducer and its state cannot follow a re-plan of the "
          "buckets there (",
          o != nullptr && o->options.fully_sharded == 1 ? "fully_sharded" : "device parameters",
          ": not yet); re-plan before creating the optimizer"));
    }
  }
  if (r.shard_gradients) {
    return absl::FailedPreconditionError(
        "a shard_gradients reducer does not rebuild its buckets (no full-size storage between "
        "backwards to move gradients through)");
  }
  if (r.in_backward) {
    return absl::FailedPreconditionError("a backward is in progress (finish it first)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<OptimizerImpl>> FindOptimizer(const void* opt) {
  ASSIGN_OR_RETURN(std::shared_ptr<OptimizerImpl> o, Find<OptimizerImpl>(opt, "opt"));
  if (o->opt == nullptr) {
    return absl::FailedPreconditionError(
        "this optimizer was lost when a re-plan of its reducer's buckets failed (see that "
        "call's error); destroy it");
  }
  return o;
}

absl::StatusOr<bool> ReplanCarryingOptimizer(ReducerImpl& r,
                                             const std::function<absl::StatusOr<bool>()>& replan) {
  const std::shared_ptr<OptimizerImpl> o = r.optimizer.lock();
  if (o == nullptr || o->opt == nullptr) {
    GroupLocks locks(r);
    return replan();
  }
  optim::Checkpoint state;
  {
    GroupLocks locks(r);
    ASSIGN_OR_RETURN(state, o->opt->GatherCheckpoint());  // nothing changed yet if this fails
    // From here a failure leaves the optimizer unusable (FindOptimizer says so): the ranks
    // failed a collective together, so the job has to stop or rebuild it anyway.
    o->units.reset();
    o->opt.reset();
    o->retired_gatherer = std::move(o->gatherer);  // the previous retired ones end here
    o->retired_gather_group = std::move(o->gather_group);
    // Whether the buckets moved does not matter here: the optimizer is built again anyway.
    RETURN_IF_ERROR(replan().status());
  }
  RETURN_IF_ERROR(BuildOptimizer(*o, o->options, o->config));
  // This rank's part of the state under the new plan, in memory; LoadState is collective (the
  // ranks agree first, so a layout error here fails every rank's load, not only this one's).
  const optim::StateHeader& h = state.header;
  const absl::Status st =
      o->opt->LoadState(optim::CheckpointRank(state, r.reducer->plan(), h.rank, h.world_size,
                                              "the re-planned optimizer state"),
                        "the re-planned optimizer state");
  if (!st.ok()) {
    o->opt.reset();
    return WithContext(st, "re-plan: carrying the optimizer state over");
  }
  // The optimizer was built again (new parameter pointers) even when the buckets did not
  // move (caps that give the same plan): the caller must fetch its pointers again.
  return true;
}

GroupLocks::GroupLocks(ReducerImpl& r) : shard_(r.shard->mu, std::defer_lock) {
  if (r.replica) {
    replica_ = std::unique_lock<std::mutex>(r.replica->mu, std::defer_lock);
    std::lock(shard_, replica_);
  } else {
    shard_.lock();
  }
}

}  // namespace braid::capi

using braid::capi::Find;
using braid::capi::Guard;
using braid::capi::ReducerImpl;

extern "C" {

braid_status_t braid_reducer_autotune(braid_reducer_t* reducer, double step_seconds, int* replanned,
                                      int* done) {
  return Guard("braid_reducer_autotune", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    if (replanned != nullptr) *replanned = 0;
    if (done != nullptr) *done = 0;
    RETURN_IF_ERROR(braid::capi::CheckReplannable(reducer, *r));
    braid::sched::GradientReducer& red = *r->reducer;
    braid::capi::GroupLocks locks(*r);
    if (r->tuner == nullptr) {
      // Candidates: the reducer's own caps (the default), then bucket caps of 1/8, 1/4, 1/2 and
      // 2x it; no credit partitions (the C API's reducer has no OpScheduler).
      const braid::sched::PlanOptions& po = red.plan().options();
      braid::sched::AutotunerConfig ac;
      for (double f : {1.0, 0.125, 0.25, 0.5, 2.0}) {
        const size_t cap = std::max<size_t>(1, static_cast<size_t>(po.bucket_cap_bytes * f));
        ac.candidates.push_back({cap, 0});
      }
      ac.timeout = red.timeout();
      ac.timeline = r->timeline.get();
      ac.replica = r->replica ? r->replica->group.get() : nullptr;
      r->first_cap = po.first_bucket_cap_bytes;
      ASSIGN_OR_RETURN(r->tuner, braid::sched::Autotuner::Create(r->shard->group.get(), ac));
    }
    braid::sched::Autotuner& tuner = *r->tuner;
    if (tuner.done()) {
      if (done != nullptr) *done = 1;
      return absl::OkStatus();
    }
    // A failed or unmeasurable step (negative, NaN) counts as infinitely slow.
    const absl::Duration took = step_seconds >= 0 && step_seconds < 1e9
                                    ? absl::Seconds(step_seconds)
                                    : absl::InfiniteDuration();
    ASSIGN_OR_RETURN(bool changed, tuner.EndStep(took));
    if (changed) {
      const size_t cap = tuner.current().bucket_cap_bytes;
      const size_t first = std::min(r->first_cap, cap);
      locks.Release();  // the re-plan takes them (and the optimizer's rebuild its own)
      ASSIGN_OR_RETURN(bool moved, braid::capi::ReplanCarryingOptimizer(
                                       *r, [&red, cap, first] { return red.Replan(cap, first); }));
      if (replanned != nullptr) *replanned = moved ? 1 : 0;
    }
    if (done != nullptr) *done = tuner.done() ? 1 : 0;
    return absl::OkStatus();
  });
}

}  // extern "C"
