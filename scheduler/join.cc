#include "scheduler/join.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::sched {

namespace {

// Waits for a launched collective; on device the next group's stream is ordered after it.
absl::Status WaitFor(absl::StatusOr<WorkPtr> w, absl::Time deadline, BufferOps& next) {
  RETURN_IF_ERROR(w.status());
  RETURN_IF_ERROR((*w)->WaitUntil(deadline));
  return next.WaitFor((*w)->device_event());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Join>> Join::Create(GradientReducer* reducer, JoinOptions options,
                                                   JoinDriver driver) {
  if (reducer == nullptr) return absl::InvalidArgumentError("join: no reducer");
  const ReducerConfig& c = reducer->config();
  if (!c.gradient_as_bucket_view) {
    return absl::UnimplementedError(
        "join: a joined rank shadows with zero gradients in the buckets; with "
        "gradient_as_bucket_view = false the reducer packs the framework's buffers instead");
  }
  std::unique_ptr<Join> j(new Join(reducer, options, std::move(driver)));
  BufferOps& ops = reducer->groups().shard->buffer_ops();
  j->on_device_ = !ops.synchronous();
  if (j->on_device_) {
    ASSIGN_OR_RETURN(j->device_, ops.Allocate(4 * sizeof(double), "join agreement"));
  }
  return j;
}

Join::Join(GradientReducer* reducer, JoinOptions options, JoinDriver driver)
    : reducer_(reducer), options_(options), driver_(std::move(driver)), host_(new double[4]) {
  if (!driver_.begin) driver_.begin = [r = reducer_](SyncMode m) { return r->BeginBackward(m); };
  if (!driver_.finish) driver_.finish = [r = reducer_](SyncMode) { return r->FinishBackward(); };
}

Join::~Join() {
  if (last_contributors_ > 0) reducer_->SetContributors(0).IgnoreError();  // inside a backward
}

Group* Join::replica() const {
  return reducer_->mode() == ReduceMode::kHybrid ? reducer_->groups().replica : nullptr;
}

int Join::world_size() const {
  return reducer_->groups().shard->size() * (replica() != nullptr ? replica()->size() : 1);
}

int Join::world_rank() const {
  const Group& shard = *reducer_->groups().shard;
  return (replica() != nullptr ? replica()->rank() * shard.size() : 0) + shard.rank();
}

absl::Status Join::SumOverWorld(double* v, int n, ReduceOp op) {
  const absl::Time deadline = absl::Now() + reducer_->timeout();
  for (int i = 0; i < n; ++i) host_[i] = v[i];
  for (Group* g : {reducer_->groups().shard, replica()}) {
    if (g == nullptr) continue;
    const size_t bytes = n * sizeof(double);
    void* buf = host_.get();
    BufferOps& mem = g->buffer_ops();
    if (on_device_) {
      buf = device_.get();
      RETURN_IF_ERROR(mem.Copy(buf, host_.get(), bytes));
    }
    absl::StatusOr<WorkPtr> w = g->AllReduce(buf, buf, n, DType::kF64, op, CollectiveOptions{});
    absl::Status st = w.ok() ? (*w)->WaitUntil(deadline) : w.status();
    if (!st.ok()) {
      // The collective may still write into its buffers: they leak rather than be freed.
      host_.release();
      device_.release();
      return WithContext(st, absl::StrCat("join: the agreement over group '", g->name(), "'"));
    }
    if (on_device_) {
      RETURN_IF_ERROR(mem.WaitFor((*w)->device_event()));
      RETURN_IF_ERROR(mem.Copy(host_.get(), buf, bytes));
      RETURN_IF_ERROR(mem.Synchronize(deadline));
    }
  }
  for (int i = 0; i < n; ++i) v[i] = host_[i];
  return absl::OkStatus();
}

absl::StatusOr<JoinStep> Join::Agree(bool has_data, SyncMode mode) {
  if (host_ == nullptr) return absl::FailedPreconditionError("join: an earlier agreement failed");
  double v[3] = {has_data ? 1.0 : 0.0, has_data && mode == SyncMode::kSync ? 1.0 : 0.0,
                 has_data && mode == SyncMode::kReduceScatterOnly ? 1.0 : 0.0};
  RETURN_IF_ERROR(SumOverWorld(v, 3, ReduceOp::Sum()));
  JoinStep step;
  step.active = static_cast<int>(v[0]);
  const int n_sync = static_cast<int>(v[1]), n_rso = static_cast<int>(v[2]);
  const int n_none = step.active - n_sync - n_rso;
  if (step.active == 0) return step;
  if (options_.throw_on_early_termination && step.active < world_size()) {
    return absl::OutOfRangeError(
        // torch's texts (its tests match them): "Detected at least one rank that exhausted
        // inputs. Throwing across all ranks." / "Rank r exhausted all inputs."
        has_data ? absl::StrCat("Detected at least one rank that exhausted inputs. Throwing "
                                "across all ranks. (join, throw_on_early_termination: ",
                                world_size() - step.active, " of ", world_size(), " ranks ran out)")
                 : absl::StrCat("Rank ", world_rank(),
                                " exhausted all inputs. (join, throw_on_early_termination)"));
  }
  if (n_sync != step.active && n_rso != step.active && n_none != step.active) {
    return absl::InvalidArgumentError(absl::StrCat(
        "join: the ranks with data disagree on this step's backward (", n_sync, " sync, ", n_rso,
        " reduce_scatter_only, ", n_none, " no_sync): every rank enters no_sync together"));
  }
  step.mode = n_sync == step.active  ? SyncMode::kSync
              : n_rso == step.active ? SyncMode::kReduceScatterOnly
                                     : SyncMode::kNoSync;
  if (has_data && step.mode != mode) {
    return absl::InternalError("join: agreement inconsistent with this rank's own mode");
  }
  if (!options_.divide_by_initial_world_size && step.mode != SyncMode::kNoSync) {
    const int contributors = step.active == world_size() ? 0 : step.active;
    if (contributors != last_contributors_) {
      RETURN_IF_ERROR(reducer_->SetContributors(contributors));
      last_contributors_ = contributors;
    }
  }
  if (has_data) {  // this rank's own accumulation window
    if (step.mode == SyncMode::kNoSync) local_sums_ = true;
    if (step.mode == SyncMode::kReduceScatterOnly) in_partial_window_ = true;
    if (step.mode == SyncMode::kSync) local_sums_ = in_partial_window_ = false;
  }
  return step;
}

absl::Status Join::Shadow(const JoinStep& step) {
  if (step.active <= 0) return absl::FailedPreconditionError("join: Shadow of a step nobody runs");
  if (reducer_->config().shard_gradients) {
    return absl::UnimplementedError(
        "join: a fully sharded (shard_gradients) reducer's joined rank shadows a step by running "
        "its own forward and backward with zero gradient marks (its unit gathers cannot be "
        "replayed from here); Agree works, Shadow does not");
  }
  if (step.mode == SyncMode::kNoSync) return absl::OkStatus();  // nothing communicated
  if (driver_.quiesce) RETURN_IF_ERROR(driver_.quiesce());
  if (!in_partial_window_) {
    // This rank contributes zeros: its own sums (a no_sync window it did not finish) and the
    // last shadow's results are dropped, as torch reduces zero tensors.
    RETURN_IF_ERROR(WithContext(reducer_->ZeroGrads(), "join: zeroing the shadow's gradients"));
  } else if (local_sums_) {
    return absl::UnimplementedError(
        "join: this rank ran out of data inside an accumulation window mixing no_sync and "
        "reduce_scatter_only backwards; its no_sync sums cannot be dropped without dropping the "
        "partial shards");
  }  // else: reduce_scatter_only consumed the gradients (zero) and keeps the partial shards
  RETURN_IF_ERROR(driver_.begin(step.mode));
  absl::Status st;
  for (const ParamSpec& p : reducer_->plan().params()) {
    st = reducer_->MarkReady(p.id);
    if (!st.ok()) break;
  }
  absl::Status done = driver_.finish(step.mode);  // ends the backward even after a failed mark
  in_partial_window_ = step.mode == SyncMode::kReduceScatterOnly;
  local_sums_ = false;
  RETURN_IF_ERROR(st);
  return done;
}

absl::StatusOr<bool> Join::RunJoined() {
  bool last = true;
  for (;;) {
    ASSIGN_OR_RETURN(JoinStep step, Agree(false, SyncMode::kSync));
    if (step.active == 0) return last;
    RETURN_IF_ERROR(Shadow(step));
    last = false;
  }
}

absl::StatusOr<int> Join::AuthoritativeRank(bool is_last_joiner) {
  if (host_ == nullptr) return absl::FailedPreconditionError("join: an earlier agreement failed");
  double v = is_last_joiner ? world_rank() : -1;
  RETURN_IF_ERROR(SumOverWorld(&v, 1, ReduceOp::Max()));
  if (last_contributors_ > 0) RETURN_IF_ERROR(reducer_->SetContributors(0));
  last_contributors_ = -1;
  if (v < 0) return absl::InternalError("join: no rank was among the last to join");
  return static_cast<int>(v);
}

absl::Status Join::Broadcast(void* buf, size_t count, DType dtype, int root) {
  return BroadcastOverWorld(*reducer_, buf, count, dtype, root);
}

absl::Status BroadcastOverWorld(const GradientReducer& reducer, void* buf, size_t count,
                                DType dtype, int root) {
  Group& shard = *reducer.groups().shard;
  Group* replica = reducer.mode() == ReduceMode::kHybrid ? reducer.groups().replica : nullptr;
  const int world = shard.size() * (replica != nullptr ? replica->size() : 1);
  if (root < 0 || root >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("join: broadcast root ", root, " outside the world of ", world));
  }
  const absl::Time deadline = absl::Now() + reducer.timeout();
  // Hybrid: the root's shard rank spreads it along every replica row, then its replica row
  // spreads it to the others.
  Group& last = replica != nullptr ? *replica : shard;
  RETURN_IF_ERROR(WaitFor(shard.Broadcast(buf, count, dtype, root % shard.size()), deadline,
                          last.buffer_ops()));
  if (replica != nullptr) {
    RETURN_IF_ERROR(WaitFor(replica->Broadcast(buf, count, dtype, root / shard.size()), deadline,
                            last.buffer_ops()));
  }
  return absl::OkStatus();
}

}  // namespace braid::sched
