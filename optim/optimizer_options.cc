#include "optim/optimizer_options.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::optim {

absl::Status CheckHyper(const GroupHyper& h, OptimizerKind kind, int group) {
  const auto bad = [group](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: parameter group ", group, ": ", what));
  };
  if (kind == OptimizerKind::kAdamW) {
    const AdamWHyper& a = h.adamw;
    if (!(a.lr >= 0)) return bad(absl::StrCat("lr must be >= 0, got ", a.lr));
    if (!(a.beta1 >= 0 && a.beta1 < 1))
      return bad(absl::StrCat("beta1 must be in [0, 1), got ", a.beta1));
    if (!(a.beta2 >= 0 && a.beta2 < 1))
      return bad(absl::StrCat("beta2 must be in [0, 1), got ", a.beta2));
    if (!(a.eps > 0)) return bad(absl::StrCat("eps must be > 0, got ", a.eps));
    if (!(a.weight_decay >= 0))
      return bad(absl::StrCat("weight_decay must be >= 0, got ", a.weight_decay));
  } else {
    const SgdHyper& s = h.sgd;
    if (!(s.lr >= 0)) return bad(absl::StrCat("lr must be >= 0, got ", s.lr));
    if (!(s.momentum >= 0)) return bad(absl::StrCat("momentum must be >= 0, got ", s.momentum));
    if (!(s.weight_decay >= 0))
      return bad(absl::StrCat("weight_decay must be >= 0, got ", s.weight_decay));
    if (s.nesterov && s.momentum == 0) return bad("nesterov needs momentum > 0");
  }
  return absl::OkStatus();
}

absl::Status CheckOptimizerSetup(sched::GradientReducer* reducer, sched::ParamGatherer* gatherer,
                                 const OptimizerConfig& config) {
  if (reducer == nullptr || gatherer == nullptr) {
    return absl::InvalidArgumentError("optimizer: needs a reducer and a gatherer");
  }
  if (reducer->mode() == sched::ReduceMode::kAllReduce) {
    return absl::InvalidArgumentError(
        "optimizer: the reducer is in all-reduce mode; the sharded optimizer needs reduce-scatter "
        "or hybrid mode (each rank steps only its shard)");
  }
  if (gatherer->plan().Fingerprint() != reducer->plan().Fingerprint()) {
    return absl::FailedPreconditionError(
        "optimizer: the gatherer was built for another bucket plan than the reducer's (rebuilt "
        "buckets? create the gatherer from the reducer's plan after the rebuild)");
  }
  Group& shard = *reducer->groups().shard;
  if (&gatherer->group() == reducer->groups().shard ||
      &gatherer->group() == reducer->groups().replica) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: the gatherer uses the reducer's group '", gatherer->group().name(),
                     "'; its all-gathers would interleave with the reductions: give it a Split of "
                     "the shard group"));
  }
  if (gatherer->group().size() != shard.size() || gatherer->group().rank() != shard.rank()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: gatherer group '", gatherer->group().name(), "' (rank ",
                     gatherer->group().rank(), " of ", gatherer->group().size(),
                     ") does not match shard group '", shard.name(), "' (rank ", shard.rank(),
                     " of ", shard.size(), "): split the shard group with key = rank"));
  }
  if (config.groups.empty()) return absl::InvalidArgumentError("optimizer: no parameter group");
  for (size_t g = 0; g < config.groups.size(); ++g) {
    RETURN_IF_ERROR(CheckHyper(config.groups[g], config.kind, static_cast<int>(g)));
  }
  const sched::BucketPlan& plan = reducer->plan();
  for (const auto& [id, g] : config.group_of) {
    absl::StatusOr<int> i = plan.IndexOf(id);
    if (!i.ok())
      return absl::NotFoundError(
          absl::StrCat("optimizer: group_of names unknown parameter id ", id));
    if (g < 0 || g >= static_cast<int>(config.groups.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: parameter ", plan.params()[*i].Label(), " is assigned to group ",
                       g, "; there are ", config.groups.size()));
    }
  }
  // The kernels (host and device) read f32, bf16 and f16 gradients and write those model
  // dtypes from f32 master weights; any other floating dtype (f64) is refused here, where the
  // caller sees it, not on the stepper thread.
  for (const sched::ParamSpec& p : plan.params()) {
    if (p.dtype != DType::kF32 && p.dtype != DType::kBF16 && p.dtype != DType::kF16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: parameter ", p.Label(), " is ", DTypeName(p.dtype),
          "; the sharded optimizer steps f32, bf16 and f16 parameters (f32 master weights)"));
    }
  }
  if (config.threads < 1) return absl::InvalidArgumentError("optimizer: threads must be >= 1");
  const sched::Bucket* first = plan.buckets().empty() ? nullptr : &plan.buckets()[0];
  if (first != nullptr && first->device.type != DeviceType::kCpu) {
    const std::string where = absl::StrCat("the parameters are on ", first->device.ToString());
    if (config.device_kernels == nullptr) {
      // C++ callers (the C API passes optim::CudaStepKernels() for device parameters).
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: ", where,
                       ": OptimizerConfig::device_kernels is required (optim::CudaStepKernels())"));
    }
    if (shard.buffer_ops().synchronous() || !shard.buffer_ops().stream()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer: ", where, " but shard group '",
                                                     shard.name(),
                                                     "' has no device stream for the step"));
    }
  }
  if (config.track_grad_norm && first != nullptr && first->device.type != DeviceType::kCpu) {
    return absl::UnimplementedError(
        "optimizer: track_grad_norm is implemented for host parameters only (on a device, "
        "max_grad_norm > 0 reports the norm, at the cost of stepping after the last reduction)");
  }
  if (!(config.max_grad_norm >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: max_grad_norm must be >= 0, got ", config.max_grad_norm));
  }
  return absl::OkStatus();
}

}  // namespace braid::optim
