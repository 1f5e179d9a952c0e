// C API: a reducer's communication hook (braid_reducer_set_comm_hook), picked among the
// built-in hooks (scheduler/hooks/).
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/status_macros.h"
#include "scheduler/hooks/int8.h"
#include "scheduler/hooks/low_precision.h"
#include "scheduler/hooks/powersgd.h"

using braid::capi::Find;
using braid::capi::Guard;
using braid::capi::ReducerImpl;

namespace {

absl::StatusOr<std::shared_ptr<braid::sched::CommHook>> MakePowerSGD(
    const braid_comm_hook_options_t& o) {
  for (const auto& [name, v] :
       {std::pair<const char*, int>{"use_error_feedback", o.use_error_feedback},
        {"warm_start", o.warm_start},
        {"replica_only", o.replica_only}}) {
    if (v != 0 && v != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("braid_comm_hook_options_t.", name, " is ", v, ": 0 or 1"));
    }
  }
  if (o.replica_only != 0) {
    return absl::InvalidArgumentError(
        "braid_comm_hook_options_t.replica_only: POWERSGD compresses all-reduce reducers only");
  }
  if (o.param_rows == nullptr && o.num_param_rows != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "braid_comm_hook_options_t.param_rows is NULL with num_param_rows ", o.num_param_rows));
  }
  braid::sched::PowerSGDOptions p;
  p.rank = o.matrix_approximation_rank;
  p.start_iter = o.start_powerSGD_iter;
  p.min_compression_rate = o.min_compression_rate;
  p.use_error_feedback = o.use_error_feedback != 0;
  p.warm_start = o.warm_start != 0;
  p.orthogonalization_epsilon = static_cast<float>(o.orthogonalization_epsilon);
  p.random_seed = o.random_seed;
  if (o.param_rows != nullptr) p.rows.assign(o.param_rows, o.param_rows + o.num_param_rows);
  return braid::sched::MakePowerSGDHook(p);
}

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
    case BRAID_COMM_HOOK_POWERSGD:
      return MakePowerSGD(o);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "braid_comm_hook_options_t.kind is ", o.kind,
          ": one of BRAID_COMM_HOOK_NONE (0), BRAID_COMM_HOOK_BF16 (1), BRAID_COMM_HOOK_FP16 (2), "
          "BRAID_COMM_HOOK_INT8 (3), BRAID_COMM_HOOK_ALLREDUCE (4), BRAID_COMM_HOOK_POWERSGD (5)"));
  }
}

}  // namespace

void braid_comm_hook_options_init(braid_comm_hook_options_t* opts) {
  if (opts == nullptr) return;
  *opts = braid_comm_hook_options_t{};
  opts->struct_size = sizeof(*opts);
  opts->kind = BRAID_COMM_HOOK_NONE;
  opts->block = braid::sched::Int8Options{}.block;
  const braid::sched::PowerSGDOptions p;
  opts->matrix_approximation_rank = p.rank;
  opts->start_powerSGD_iter = p.start_iter;
  opts->use_error_feedback = p.use_error_feedback ? 1 : 0;
  opts->warm_start = p.warm_start ? 1 : 0;
  opts->min_compression_rate = p.min_compression_rate;
  opts->orthogonalization_epsilon = p.orthogonalization_epsilon;
  opts->random_seed = p.random_seed;
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
    if (r->join != nullptr) {
      return absl::FailedPreconditionError(
          "a join is open on this reducer (braid_join_begin): set the hook before it or after "
          "braid_join_end");
    }
    ASSIGN_OR_RETURN(std::shared_ptr<braid::sched::CommHook> hook, MakeHook(o));
    const std::string name = hook == nullptr ? "" : hook->name();
    braid::capi::GroupLocks locks(*r);  // collective on the reducer's groups
    RETURN_IF_ERROR(r->stack->reducer().SetCommHook(hook));
    r->comm_hook = name;
    r->comm_hook_object = std::move(hook);
    return absl::OkStatus();
  });
}
