// What the handles of impl.h share: the optimizer handle's lookup and end, the group locks.
#include "capi/impl.h"

#include "comm/status_macros.h"

namespace braid::capi {

OptimizerImpl::~OptimizerImpl() {
  if (attached) reducer->stack->DropParamSide();
}

absl::StatusOr<std::shared_ptr<OptimizerImpl>> FindOptimizer(const void* opt) {
  ASSIGN_OR_RETURN(std::shared_ptr<OptimizerImpl> o, Find<OptimizerImpl>(opt, "opt"));
  RETURN_IF_ERROR(o->stack().LiveOptimizer().status());
  return o;
}

absl::StatusOr<std::shared_ptr<OptimizerImpl>> FindParamSide(const void* opt) {
  ASSIGN_OR_RETURN(std::shared_ptr<OptimizerImpl> o, Find<OptimizerImpl>(opt, "opt"));
  RETURN_IF_ERROR(o->stack().CheckParamSide());
  return o;
}

GroupLocks::GroupLocks(ReducerImpl& r) : shard_(r.shard->mu, std::defer_lock) {
  if (r.replica) {
    replica_ = std::unique_lock<std::mutex>(r.replica->mu, std::defer_lock);
    std::lock(shard_, replica_);
  } else {
    shard_.lock();
  }
}

}  // namespace braid::capi
