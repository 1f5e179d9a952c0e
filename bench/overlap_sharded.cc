#include "bench/overlap_sharded.h"

#include <utility>

#include "comm/status_macros.h"

namespace braid::bench {

absl::StatusOr<std::unique_ptr<ShardedStack>> ShardedStack::Create(
    Group& world, const OverlapModel& model, sched::OpScheduler* scheduler, absl::Duration timeout,
    size_t bucket_cap_bytes, size_t first_bucket_cap_bytes) {
  std::unique_ptr<ShardedStack> s(new ShardedStack());
  s->model_ = &model;
  std::vector<sched::ParamSpec> params = model.params;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    for (int p : model.layers[l].params) params[p].unit = static_cast<int>(l);
  }
  ASSIGN_OR_RETURN(s->gather_group_, world.Split(0, world.rank(), "gather"));
  sched::ReducerConfig rc;
  rc.mode = sched::ReduceMode::kReduceScatter;
  rc.timeout = timeout;
  rc.scheduler = scheduler;
  rc.bucket_cap_bytes = bucket_cap_bytes;
  rc.first_bucket_cap_bytes = first_bucket_cap_bytes;
  ASSIGN_OR_RETURN(s->reducer_, sched::GradientReducer::Create(params, {&world, nullptr}, rc));
  sched::GathererConfig gc;
  gc.timeout = timeout;
  gc.fully_sharded = true;
  gc.scheduler = scheduler;
  ASSIGN_OR_RETURN(s->gatherer_,
                   sched::ParamGatherer::Create(s->reducer_->plan(), s->gather_group_.get(), gc));
  sched::UnitConfig uc;
  uc.timeout = timeout;
  uc.prefetch = 1;
  ASSIGN_OR_RETURN(s->units_, sched::UnitScheduler::Create(s->gatherer_.get(), uc));
  return s;
}

absl::Status ShardedStack::SetScheduler(sched::OpScheduler* scheduler) {
  gatherer_->SetScheduler(scheduler);
  return reducer_->SetScheduler(scheduler);
}

ShardedStack::~ShardedStack() {
  units_.reset();
  gatherer_.reset();
  reducer_.reset();
}

absl::Status ShardedStack::Step(ShardedStep kind, const std::function<void(int, bool)>& compute,
                                std::chrono::steady_clock::time_point* backward_end) {
  const int layers = static_cast<int>(model_->layers.size());
  const bool with_compute = kind != ShardedStep::kCommOnly;
  for (int l = 0; l < layers; ++l) {
    RETURN_IF_ERROR(units_->BeginForward(l));
    if (with_compute) compute(l, true);
    RETURN_IF_ERROR(units_->EndForward(l));
  }
  const bool marks_inline = kind != ShardedStep::kSyncAfterBackward;
  if (marks_inline) RETURN_IF_ERROR(reducer_->BeginBackward(sched::SyncMode::kSync));
  for (int l = layers - 1; l >= 0; --l) {
    RETURN_IF_ERROR(units_->BeginBackward(l));
    if (with_compute) compute(l, false);
    if (marks_inline) {
      const std::vector<int>& ps = model_->layers[l].params;
      for (auto it = ps.rbegin(); it != ps.rend(); ++it)
        RETURN_IF_ERROR(reducer_->MarkReady(model_->params[*it].id));
    }
    RETURN_IF_ERROR(units_->EndBackward(l));
  }
  *backward_end = std::chrono::steady_clock::now();
  if (!marks_inline) {
    RETURN_IF_ERROR(reducer_->BeginBackward(sched::SyncMode::kSync));
    for (int l = layers - 1; l >= 0; --l) {
      const std::vector<int>& ps = model_->layers[l].params;
      for (auto it = ps.rbegin(); it != ps.rend(); ++it)
        RETURN_IF_ERROR(reducer_->MarkReady(model_->params[*it].id));
    }
  }
  RETURN_IF_ERROR(reducer_->FinishBackward());
  return units_->EndStep();
}

}  // namespace braid::bench
