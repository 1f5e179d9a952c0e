// C API: one optimizer over several reducers (braid_optimizer_create_linked): one optimizer
// handle per reducer, built by optim/linked_optimizers.h around one global gradient norm.
#include <algorithm>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "capi/errors.h"
#include "capi/handles.h"
#include "capi/impl.h"
#include "capi/optimizer_create.h"
#include "comm/status_macros.h"
#include "optim/linked_optimizers.h"

using braid::capi::CheckNotNull;
using braid::capi::Find;
using braid::capi::GroupImpl;
using braid::capi::Guard;
using braid::capi::OptimizerImpl;
using braid::capi::ReducerImpl;

namespace braid::capi {
namespace {

// Every distinct group mutex of the call, locked in address order (no C API call on any of
// these groups interleaves the collective creation; a group two reducers share is locked once).
class AllGroupLocks {
 public:
  explicit AllGroupLocks(std::vector<GroupImpl*> groups) {
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    for (GroupImpl* g : groups) {
      if (g != nullptr) locks_.emplace_back(g->mu);
    }
  }

 private:
  std::vector<std::unique_lock<std::mutex>> locks_;
};

}  // namespace
}  // namespace braid::capi

extern "C" {

braid_status_t braid_optimizer_create_linked(braid_reducer_t* const* reducers, int n,
                                             const braid_optimizer_options_t* const* opts,
                                             const int* tp_replicated, braid_group_t* span,
                                             braid_group_t* tensor_parallel,
                                             braid_optimizer_t** out) {
  return Guard("braid_optimizer_create_linked", [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckNotNull(reducers, "reducers"));
    RETURN_IF_ERROR(CheckNotNull(opts, "opts"));
    RETURN_IF_ERROR(CheckNotNull(out, "out"));
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("n must be >= 1, got ", n));
    ASSIGN_OR_RETURN(std::shared_ptr<GroupImpl> span_impl, Find<GroupImpl>(span, "span"));
    std::shared_ptr<GroupImpl> tp_impl;
    if (tensor_parallel != nullptr) {
      ASSIGN_OR_RETURN(tp_impl, Find<GroupImpl>(tensor_parallel, "tensor_parallel"));
    }
    std::vector<std::shared_ptr<OptimizerImpl>> impls;
    std::vector<braid::optim::LinkedMember> members;
    std::vector<GroupImpl*> groups = {span_impl.get(), tp_impl.get()};
    for (int i = 0; i < n; ++i) {
      const std::string name = absl::StrCat("reducers[", i, "]");
      auto impl = std::make_shared<OptimizerImpl>();
      ASSIGN_OR_RETURN(impl->reducer, Find<ReducerImpl>(reducers[i], name.c_str()));
      if (tp_replicated != nullptr && tp_replicated[i] != 0 && tp_replicated[i] != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("tp_replicated[", i, "] must be 0 or 1, got ", tp_replicated[i]));
      }
      braid::optim::LinkedMember m;
      m.stack = &impl->stack();
      m.tp_replicated = tp_replicated != nullptr && tp_replicated[i] == 1;
      absl::StatusOr<braid::optim::ParamOptions> po =
          braid::capi::ToParamOptions(impl->stack(), opts[i], &impl->kind);
      if (!po.ok()) return braid::WithContext(po.status(), absl::StrCat("opts[", i, "]"));
      m.options = *std::move(po);
      members.push_back(std::move(m));
      groups.push_back(impl->reducer->shard.get());
      groups.push_back(impl->reducer->replica.get());
      impls.push_back(std::move(impl));
    }
    {
      braid::capi::AllGroupLocks locks(groups);  // collective over span, then each reducer's
      RETURN_IF_ERROR(braid::optim::AddLinkedParamSides(
          members, *span_impl->group, tp_impl != nullptr ? tp_impl->group.get() : nullptr));
    }
    for (auto& impl : impls) impl->attached = true;  // each handle now drops its own side
    std::vector<braid_optimizer_t*> handles;
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<braid_optimizer_t*> h = braid::capi::Register(impls[i], {reducers[i]});
      if (!h.ok()) {
        for (braid_optimizer_t* done : handles) braid_optimizer_destroy(done);
        impls.clear();  // the rest drop their sides as they go
        return h.status();
      }
      handles.push_back(*h);
    }
    std::copy(handles.begin(), handles.end(), out);
    return absl::OkStatus();
  });
}

}  // extern "C"
