// C API: a reducer's communication hook (braid_reducer_set_comm_hook), picked among the
// built-in hooks (scheduler/hooks/).
#include <memory>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/status_macros.h"
#include "scheduler/hooks/int8.h"
#include "scheduler/hooks/low_precision.h"

using braid::capi::Find;
using braid::capi::Guard;
using braid::capi::ReducerImpl;

namespace {

absl::StatusOr<std::shared_ptr<braid::sched::CommHook>> MakeHook(
    const braid_comm_hook_options_t& o) {
  switch (o.kind) {
    case BRAID_COMM_HOOK_NONE:
      return nullptr;
    case BRAID_COMM_HOOK_BF16:
    case BRAID_COMM_HOOK_FP16:
      return braid::sched::MakeLowPrecisionHook(
          {o.kind == BRAID_COMM_HOOK_BF16 ? braid::DType::kBF16 : braid::DType::kF16,
           o.replica_only != 0});
    case BRAID_COMM_HOOK_ALLREDUCE:
      return braid::sched::MakeDivideFirstHook(o.replica_only != 0);
    case BRAID_COMM_HOOK_INT8:
      return braid::sched::MakeInt8Hook({o.block, o.replica_only != 0});
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "braid_comm_hook_options_t.kind is ", o.kind,
          ": one of BRAID_COMM_HOOK_NONE (0), BRAID_COMM_HOOK_BF16 (1), BRAID_COMM_HOOK_FP16 (2), "
          "BRAID_COMM_HOOK_INT8 (3), BRAID_COMM_HOOK_ALLREDUCE (4)"));
  }
}

}  // namespace

void braid_comm_hook_options_init(braid_comm_hook_options_t* opts) {
  if (opts == nullptr) return;
  *opts = braid_comm_hook_options_t{};
  opts->struct_size = sizeof(*opts);
  opts->kind = BRAID_COMM_HOOK_NONE;
  opts->block = braid::sched::Int8Options{}.block;
}

braid_status_t braid_reducer_set_comm_hook(braid_reducer_t* reducer,
                                           const braid_comm_hook_options_t* opts) {
  return Guard("braid_reducer_set_comm_hook", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    braid_comm_hook_options_t o;
    braid_comm_hook_options_init(&o);
    RETURN_IF_ERROR(braid::capi::ReadOptions(opts, "braid_comm_hook_options_t", &o));
    if (o.replica_only != 0 && o.replica_only != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("braid_comm_hook_options_t.replica_only is ", o.replica_only, ": 0 or 1"));
    }
    ASSIGN_OR_RETURN(std::shared_ptr<braid::sched::CommHook> hook, MakeHook(o));
    braid::capi::GroupLocks locks(*r);  // collective on the reducer's groups
    return r->stack->reducer().SetCommHook(std::move(hook));
  });
}
