#include "optim/global_norm.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::optim {

absl::Status CheckGlobalNormConfig(const OptimizerConfig& config) {
  if (config.global_norm == nullptr) return absl::OkStatus();
  if (!config.overlap) {
    // Each member's step waits for the others' norms: Step() calls made one after another
    // would wait for each other.
    return absl::InvalidArgumentError(
        "optimizer: a global norm shared with other optimizers needs overlap on");
  }
  if (config.norm_member < 0 || config.norm_member >= config.global_norm->members()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: norm_member ", config.norm_member, " is not one of the ",
                     config.global_norm->members(), " optimizers of the global norm"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<GlobalNorm>> GlobalNorm::Create(Group& span, Group* tensor_parallel,
                                                               std::vector<Member> members,
                                                               bool on_device,
                                                               sched::MemoryStats* memory) {
  if (members.empty()) return absl::InvalidArgumentError("global norm: no optimizer to join");
  std::shared_ptr<GlobalNorm> n(new GlobalNorm());
  const bool tp_rank0 = tensor_parallel == nullptr || tensor_parallel->rank() == 0;
  for (size_t m = 0; m < members.size(); ++m) {
    const Member& mb = members[m];
    if (mb.groups.shard == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("global norm: optimizer ", m, " has no shard group"));
    }
    Slot s;
    s.counted = (mb.groups.replica == nullptr || mb.groups.replica->rank() == 0) &&
                (!mb.tp_replicated || tp_rank0);
    n->slots_.push_back(s);
  }
  std::vector<OptimizerShard> none;
  ASSIGN_OR_RETURN(n->agreement_,
                   NormAgreement::Create(span, on_device, /*device_norms=*/false, none, memory));
  return n;
}

absl::Status GlobalNorm::Combine(int member, double* sumsq, double* failed, absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  Slot& mine = slots_.at(member);
  const uint64_t seq = ++mine.seq;
  mine.sumsq = *sumsq;
  mine.failed = *failed;
  const bool last =
      std::all_of(slots_.begin(), slots_.end(), [seq](const Slot& s) { return s.seq == seq; });
  if (last) {
    // In member order, so every rank adds the same terms in the same order.
    double total = 0, any_failed = 0;
    for (const Slot& s : slots_) {
      if (s.counted) total += s.sumsq;
      any_failed = std::max(any_failed, s.failed > 0 ? 1.0 : 0.0);
    }
    lock.unlock();  // the all-reduce runs without the lock; the others wait for seq
    absl::Status st = agreement_->Sum2(agreement_->group(), &total, &any_failed, deadline);
    lock.lock();
    result_ = Result{seq, total, any_failed, std::move(st)};
    cv_.notify_all();
  } else if (!cv_.wait_until(lock, absl::ToChronoTime(deadline),
                             [&] { return result_.seq >= seq; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("global norm '", name(), "': optimizer ", member,
                     " waited for the other optimizers' gradient norms past its deadline"));
  }
  if (result_.seq != seq) {
    return absl::AbortedError(absl::StrCat("global norm '", name(), "': optimizer ", member,
                                           " fell a step behind the others"));
  }
  *sumsq = result_.sumsq;
  *failed = result_.failed;
  return result_.status;
}

}  // namespace braid::optim
