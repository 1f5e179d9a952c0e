// C API: a reducer's comm hook state for checkpoints (braid_reducer_comm_hook_state / _load_state,
// scheduler/comm_hook.h's SaveState / LoadState).
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "comm/status_macros.h"
#include "scheduler/comm_hook.h"

using braid::capi::Find;
using braid::capi::Guard;
using braid::capi::ReducerImpl;

namespace {

absl::Status NotInBackward(const ReducerImpl& r, const char* fn) {
  if (!r.stack->in_backward()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(fn, ": the reducer is inside a backward (call it between backwards)"));
}

}  // namespace

extern "C" {

braid_status_t braid_reducer_comm_hook_state(braid_reducer_t* reducer, void* data, size_t capacity,
                                             size_t* size) {
  return Guard("braid_reducer_comm_hook_state", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    if (size == nullptr) return absl::InvalidArgumentError("size is NULL");
    RETURN_IF_ERROR(NotInBackward(*r, "braid_reducer_comm_hook_state"));
    std::string state;
    if (r->comm_hook_object != nullptr) {
      ASSIGN_OR_RETURN(state, r->comm_hook_object->SaveState());
    }
    *size = state.size();
    if (data == nullptr) return absl::OkStatus();
    if (capacity < state.size()) {
      return absl::OutOfRangeError(absl::StrCat("the '", r->comm_hook, "' hook's state is ",
                                                state.size(), " bytes; capacity is ", capacity));
    }
    std::memcpy(data, state.data(), state.size());
    return absl::OkStatus();
  });
}

braid_status_t braid_reducer_comm_hook_load_state(braid_reducer_t* reducer, const void* data,
                                                  size_t size) {
  return Guard("braid_reducer_comm_hook_load_state", [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto r, Find<ReducerImpl>(reducer, "reducer"));
    if (data == nullptr && size > 0) return absl::InvalidArgumentError("data is NULL");
    RETURN_IF_ERROR(NotInBackward(*r, "braid_reducer_comm_hook_load_state"));
    if (r->comm_hook_object == nullptr) {
      if (size == 0) return absl::OkStatus();
      return absl::FailedPreconditionError(
          "this reducer has no comm hook (braid_reducer_set_comm_hook first, with the options "
          "the state was saved with)");
    }
    return r->comm_hook_object->LoadState(absl::string_view(static_cast<const char*>(data), size));
  });
}

}  // extern "C"
