// The C API of the reducer's used-map agreement (scheduler/used_map.h): the declaration of the
// parameters a rank will not mark, and the agreed map.
#include <cstdint>
#include <vector>

#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/status_macros.h"

using braid::capi::CheckNotNull;
using braid::capi::Find;
using braid::capi::Guard;
using braid::capi::ReducerImpl;

extern "C" {

braid_status_t braid_reducer_declare_unused(braid_reducer_t* reducer, const int64_t* ids,
                                            size_t n) {
  return Guard("braid_reducer_declare_unused", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    if (n > 0) RETURN_IF_ERROR(CheckNotNull(ids, "ids"));
    std::vector<braid::sched::ParamId> list(n);
    for (size_t k = 0; k < n; ++k) list[k] = ids[k];
    return r->stack->reducer().DeclareUnused(list);
  });
}

braid_status_t braid_reducer_param_used(braid_reducer_t* reducer, int64_t id, int* used) {
  return Guard("braid_reducer_param_used", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    RETURN_IF_ERROR(CheckNotNull(used, "used"));
    ASSIGN_OR_RETURN(bool u, r->stack->reducer().Used(id));
    *used = u ? 1 : 0;
    return absl::OkStatus();
  });
}

}  // extern "C"
