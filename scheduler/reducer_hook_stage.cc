// ReducerStages with a comm hook (scheduler/comm_hook.h): the hook runs a stage in place of its
// collective, and its result is delivered into the stage's buffer before the rest of the
// pipeline (reducer_stages.cc) runs as after the default collective.
#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/reducer_stages.h"

namespace braid::sched {

WorkPtr ReducerStages::RunHookLocked(int b, int stage, const ReductionRequest& req) {
  ReducerBucketState& s = *buckets_[b];
  ReducerBucketState::Stage& rec = s.stage[stage];
  CommBucket bucket;
  bucket.index = b;
  bucket.stage = stage == 1                               ? CommStage::kReplicaAllReduce
                 : req.kind == CollectiveKind::kAllReduce ? CommStage::kAllReduce
                                                          : CommStage::kReduceScatter;
  bucket.group = req.group;
  bucket.send = req.send;
  bucket.count = req.count;
  bucket.dtype = req.dtype;
  bucket.options = req.options;
  bucket.options.label = s.hook_label;
  bucket.last = static_cast<size_t>(b) + 1 == plan_.buckets().size();
  if (bucket.stage == CommStage::kAllReduce) {
    for (int i : plan_.buckets()[b].params) {
      bucket.params.push_back(CommParam{i, plan_.slot(i).offset, plan_.params()[i].count});
    }
  }
  rec.kind = bucket.stage;
  rec.recv = static_cast<char*>(req.recv);
  rec.count = req.count;
  rec.hooked = CommResult{};
  absl::StatusOr<CommResult> r = rec.hook->Run(bucket);
  if (r.ok() && r->work == nullptr) r = absl::InternalError("returned no work");
  if (!r.ok()) {
    return Work::Completed(WorkInfo{req.group->name(), "comm hook", 0, s.hook_label}, r.status());
  }
  rec.hooked = *std::move(r);
  return rec.hooked.work;
}

absl::Status ReducerStages::DeliverHook(int b, int stage, const absl::Status& done) {
  ReducerBucketState& s = *buckets_[b];
  ReducerBucketState::Stage& rec = s.stage[stage];
  const CommResult& r = rec.hooked;
  const DType t = storage_->CommDType(b);
  absl::Status st = done;
  if (st.ok() && (r.data == nullptr || r.count != rec.count || !IsFloating(r.dtype))) {
    st = absl::InvalidArgumentError(
        absl::StrCat("returned ", r.count, " element(s) of ", DTypeName(r.dtype),
                     r.data == nullptr ? " at a null address" : "", " for a result of ", rec.count,
                     " floating element(s)"));
  }
  if (st.ok()) {
    st = r.dtype == t ? ops_.Copy(rec.recv, r.data, rec.count * DTypeSize(t))
                      : ops_.CastScale(r.data, r.dtype, rec.recv, t, rec.count, ScaleSpec{});
  }
  absl::Status named = CommHookError(s.label, *rec.hook, rec.kind, st);
  rec.hooked = CommResult{};  // the hook's buffers are not read after this
  return named;
}

absl::Status GradientReducer::SetCommHook(std::shared_ptr<CommHook> hook) {
  if (in_backward_.load())
    return absl::FailedPreconditionError("setting a comm hook during a backward");
  if (hook != nullptr && !ops_.synchronous()) {
    return absl::UnimplementedError(
        absl::StrCat("comm hook '", hook->name(), "': hooks run on host buckets only (group '",
                     groups_.shard->name(), "' reduces in device memory)"));
  }
  RETURN_IF_ERROR(VerifyCommHookAcrossRanks(hook.get(), *groups_.shard, config_.timeout));
  if (config_.mode == ReduceMode::kHybrid) {
    RETURN_IF_ERROR(VerifyCommHookAcrossRanks(hook.get(), *groups_.replica, config_.timeout));
  }
  if (hook != nullptr) {
    const bool any = config_.mode == ReduceMode::kAllReduce
                         ? hook->Handles(CommStage::kAllReduce)
                         : hook->Handles(CommStage::kReduceScatter) ||
                               (config_.mode == ReduceMode::kHybrid &&
                                hook->Handles(CommStage::kReplicaAllReduce));
    if (!any) {
      return absl::InvalidArgumentError(absl::StrCat(
          "comm hook '", hook->name(), "' handles none of the stages of this reducer's mode (",
          config_.mode == ReduceMode::kAllReduce ? "allreduce" : "reduce_scatter",
          "); a replica-only hook needs a hybrid reducer"));
    }
  }
  if (hook != nullptr) {
    RETURN_IF_ERROR(hook->Attach(
        CommAttach{groups_.shard, &plan_.params(), config_.timeout, plan_.Fingerprint()}));
  }
  stages_->SetCommHook(std::move(hook));
  return absl::OkStatus();
}

}  // namespace braid::sched
