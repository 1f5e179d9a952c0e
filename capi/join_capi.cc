// C API: uneven inputs (join) on a reducer handle, over scheduler/join.h with the training
// stack's driver (optim/join_driver.h).
#include <memory>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/convert.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/status_macros.h"
#include "optim/join_driver.h"
#include "scheduler/join.h"

using braid::capi::CheckNotNull;
using braid::capi::Find;
using braid::capi::Guard;
using braid::capi::RawEnum;
using braid::capi::ReducerImpl;

namespace braid::capi {
namespace {

absl::StatusOr<sched::Join*> OpenJoin(ReducerImpl& r) {
  if (r.join == nullptr) {
    return absl::FailedPreconditionError("no join is open on this reducer (braid_join_begin)");
  }
  return r.join.get();
}

int ToRawSyncMode(sched::SyncMode m) {
  switch (m) {
    case sched::SyncMode::kSync:
      return BRAID_SYNC;
    case sched::SyncMode::kNoSync:
      return BRAID_NO_SYNC;
    case sched::SyncMode::kReduceScatterOnly:
      return BRAID_REDUCE_SCATTER_ONLY;
  }
  return BRAID_SYNC;
}

}  // namespace
}  // namespace braid::capi

extern "C" {

void braid_join_options_init(braid_join_options_t* opts) {
  if (opts == nullptr) return;
  const braid::sched::JoinOptions d;
  *opts = braid_join_options_t{};
  opts->struct_size = sizeof(*opts);
  opts->divide_by_initial_world_size = d.divide_by_initial_world_size ? 1 : 0;
  opts->throw_on_early_termination = d.throw_on_early_termination ? 1 : 0;
}

braid_status_t braid_join_begin(braid_reducer_t* reducer, const braid_join_options_t* opts) {
  return Guard("braid_join_begin", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    braid_join_options_t o;
    braid_join_options_init(&o);
    RETURN_IF_ERROR(braid::capi::ReadOptions(opts, "braid_join_options_t", &o));
    if (r->join != nullptr) return absl::FailedPreconditionError("a join is already open");
    if (r->stack->in_backward())
      return absl::FailedPreconditionError("braid_join_begin inside a backward");
    RETURN_IF_ERROR(braid::optim::JoinableStack(*r->stack));
    if (o.divide_by_initial_world_size == 0 && !r->comm_hook.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "divide_by_initial_world_size = 0 with comm hook '", r->comm_hook,
          "': the hook averages over its group's size, not over the ranks that contributed; "
          "keep the default divide (the initial world size) or remove the hook first"));
    }
    braid::sched::JoinOptions jo;
    jo.divide_by_initial_world_size = o.divide_by_initial_world_size != 0;
    jo.throw_on_early_termination = o.throw_on_early_termination != 0;
    ASSIGN_OR_RETURN(r->join, braid::sched::Join::Create(&r->stack->reducer(), jo,
                                                         braid::optim::StackJoinDriver(*r->stack)));
    r->join_step = {};
    r->joined = false;
    return absl::OkStatus();
  });
}

braid_status_t braid_join_agree(braid_reducer_t* reducer, int has_data, braid_sync_mode_t mode,
                                int* active, braid_sync_mode_t* agreed) {
  return Guard("braid_join_agree", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(active, "active"));
    ASSIGN_OR_RETURN(braid::sched::Join * join, braid::capi::OpenJoin(*r));
    braid::sched::SyncMode m = braid::sched::SyncMode::kSync;
    if (has_data) {
      ASSIGN_OR_RETURN(m, braid::capi::ToSyncMode(RawEnum(mode)));
    }
    braid::capi::GroupLocks locks(*r);  // collective on the reducer's groups
    r->join_step = {};
    r->joined = false;
    ASSIGN_OR_RETURN(braid::sched::JoinStep step, join->Agree(has_data != 0, m));
    r->join_step = step;
    r->joined = has_data == 0;
    *active = step.active;
    if (agreed != nullptr) {
      *agreed = static_cast<braid_sync_mode_t>(braid::capi::ToRawSyncMode(step.mode));
    }
    return absl::OkStatus();
  });
}

braid_status_t braid_join_shadow(braid_reducer_t* reducer) {
  return Guard("braid_join_shadow", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    ASSIGN_OR_RETURN(braid::sched::Join * join, braid::capi::OpenJoin(*r));
    if (!r->joined || r->join_step.active == 0) {
      return absl::FailedPreconditionError(
          "braid_join_shadow: the last braid_join_agree was not a joined rank's with ranks "
          "still active");
    }
    r->joined = false;  // one shadow per agreement
    braid::capi::GroupLocks locks(*r);
    return join->Shadow(r->join_step);
  });
}

braid_status_t braid_join_end(braid_reducer_t* reducer, int is_last_joiner, int* root) {
  return Guard("braid_join_end", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(root, "root"));
    ASSIGN_OR_RETURN(braid::sched::Join * join, braid::capi::OpenJoin(*r));
    braid::capi::GroupLocks locks(*r);
    absl::StatusOr<int> rank = join->AuthoritativeRank(is_last_joiner != 0);
    r->join.reset();  // closed either way
    RETURN_IF_ERROR(rank.status());
    *root = *rank;
    return absl::OkStatus();
  });
}

braid_status_t braid_join_abort(braid_reducer_t* reducer) {
  return Guard("braid_join_abort", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    if (r->stack->in_backward())
      return absl::FailedPreconditionError("braid_join_abort inside a backward");
    r->join.reset();  // its destructor clears the divide override
    r->joined = false;
    return absl::OkStatus();
  });
}

braid_status_t braid_join_broadcast(braid_reducer_t* reducer, void* buf, size_t count,
                                    braid_dtype_t dtype, int root) {
  return Guard("braid_join_broadcast", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    if (count > 0) RETURN_IF_ERROR(CheckNotNull(buf, "buf"));
    ASSIGN_OR_RETURN(braid::DType t, braid::capi::ToDType(RawEnum(dtype), "dtype"));
    braid::capi::GroupLocks locks(*r);
    return braid::sched::BroadcastOverWorld(r->stack->reducer(), buf, count, t, root);
  });
}

}  // extern "C"
