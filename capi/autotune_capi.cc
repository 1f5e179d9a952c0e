// C API: re-planning a reducer's buckets between steps (braid_reducer_rebuild_buckets' checks,
// shared) and the autotuner (braid_reducer_autotune over scheduler/bucket_tuner.h).
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::capi {

absl::Status CheckReplannable(braid_reducer_t* handle, const ReducerImpl& r) {
  if (HandleRegistry::Get().Children(handle, Tag::kOptimizer) != 0) {
    return absl::FailedPreconditionError(
        "an optimizer was built on this reducer: its state is laid out by the buckets, which "
        "can no longer be rebuilt (rebuild before creating the optimizer)");
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

GroupLocks::GroupLocks(ReducerImpl& r) : shard_(r.shard->mu, std::defer_lock) {
  if (r.replica) {
    replica_ = std::unique_lock<std::mutex>(r.replica->mu, std::defer_lock);
    std::lock(shard_, replica_);
  } else {
    shard_.lock();
  }
}

namespace {

// The maximum of `seconds` over the reducer's groups (shard, then replica), identical on every
// rank. Device groups reduce in a staged buffer of theirs.
absl::StatusOr<double> AgreedMax(ReducerImpl& r, double seconds, absl::Duration timeout) {
  std::vector<Group*> chain = {r.shard->group.get()};
  if (r.replica) chain.push_back(r.replica->group.get());
  double t = seconds;
  for (Group* g : chain) {
    CollectiveOptions opts;
    opts.label = "autotune step time";
    const absl::Time deadline = absl::Now() + timeout;
    BufferOps& ops = g->buffer_ops();
    if (ops.synchronous()) {
      ASSIGN_OR_RETURN(WorkPtr w, g->AllReduce(&t, &t, 1, DType::kF64, ReduceOp::Max(), opts));
      RETURN_IF_ERROR(w->WaitUntil(deadline));
      continue;
    }
    ASSIGN_OR_RETURN(OwnedBuffer staged, ops.Allocate(sizeof t, opts.label));
    RETURN_IF_ERROR(ops.Copy(staged.get(), &t, sizeof t));
    ASSIGN_OR_RETURN(WorkPtr w, g->AllReduce(staged.get(), staged.get(), 1, DType::kF64,
                                             ReduceOp::Max(), opts));
    absl::Status st = w->WaitUntil(deadline);
    if (st.ok()) st = ops.Copy(&t, staged.get(), sizeof t);
    if (st.ok()) st = ops.Synchronize(deadline);
    if (!st.ok()) {
      (void)staged.release();  // the device may still write into it
      return st;
    }
  }
  return t;
}

}  // namespace
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
    if (r->tuner == nullptr) {
      const braid::sched::PlanOptions& po = red.plan().options();
      r->tuner = std::make_unique<braid::sched::BucketTuner>(
          braid::sched::TunerConfig{}, po.bucket_cap_bytes, po.first_bucket_cap_bytes);
    }
    braid::sched::BucketTuner& tuner = *r->tuner;
    if (tuner.done()) {
      if (done != nullptr) *done = 1;
      return absl::OkStatus();
    }
    braid::capi::GroupLocks locks(*r);
    ASSIGN_OR_RETURN(double agreed,
                     braid::capi::AgreedMax(*r, step_seconds, red.timeout()));
    braid::sched::Timeline* tl = r->timeline.get();
    const int track = tl != nullptr ? tl->Track("autotune") : 0;
    const size_t trials_before = tuner.table().size();
    const braid::sched::TunerDecision d = tuner.Observe(agreed);
    if (tl != nullptr) {
      tl->Counter(track, "step ms", static_cast<int64_t>(agreed * 1e3 + 0.5));
      for (size_t k = trials_before; k < tuner.table().size(); ++k) {
        tl->Instant(track, "trial",
                    static_cast<int64_t>(tuner.candidates()[tuner.table()[k].candidate].bucket_cap >> 10));
      }
    }
    if (d.switch_to) {
      ASSIGN_OR_RETURN(bool changed, red.Replan(d.switch_to->bucket_cap, d.switch_to->first_cap));
      if (replanned != nullptr) *replanned = changed ? 1 : 0;
      if (tl != nullptr) tl->Instant(track, "replan", static_cast<int64_t>(d.switch_to->bucket_cap >> 10));
    }
    if (tuner.done()) {
      if (done != nullptr) *done = 1;
      braid::Log().info("autotune settled after {} trials:\n{}", tuner.table().size(), tuner.TableText());
    }
    return absl::OkStatus();
  });
}

}  // extern "C"
