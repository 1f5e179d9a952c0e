#include "bench/overlap_sharded.h"

#include <utility>
#include <vector>

#include "comm/status_macros.h"

namespace braid::bench {

absl::StatusOr<std::unique_ptr<optim::TrainingStack>> MakeShardedStack(
    Group& world, const OverlapModel& model, absl::Duration timeout, size_t bucket_cap_bytes,
    size_t first_bucket_cap_bytes) {
  std::vector<sched::ParamSpec> params = model.params;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    for (int p : model.layers[l].params) params[p].unit = static_cast<int>(l);
  }
  optim::StackOptions so;
  so.reducer.mode = sched::ReduceMode::kReduceScatter;
  so.reducer.timeout = timeout;
  so.reducer.bucket_cap_bytes = bucket_cap_bytes;
  so.reducer.first_bucket_cap_bytes = first_bucket_cap_bytes;
  ASSIGN_OR_RETURN(auto stack,
                   optim::TrainingStack::Create(std::move(params), {&world, nullptr}, so));
  optim::ParamOptions po;
  po.fully_sharded = true;
  po.timeout = timeout;
  po.units.timeout = timeout;
  po.units.prefetch = 1;
  RETURN_IF_ERROR(stack->AddParamSide(po));
  return stack;
}

}  // namespace braid::bench
