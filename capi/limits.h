// Limits on what enters the C API, checked at the entry point before anything is started, with
// one rule wherever the same value enters; errors name the argument as the caller wrote it
// ("opts->lr", "hyper->eps", "params[3].count"). braid.h states each limit.
//
//   RETURN_IF_ERROR(CheckHyperFinite(h, kind, "opts->"));  // create; "hyper->" / "" elsewhere
//
// Why: a non-finite hyper-parameter turns every parameter into inf/NaN at the next step (a
// silent wrong result), a count whose bytes wrap size_t hands out views larger than their
// storage, and an unbounded thread or rank count exhausts the machine before any error.
#ifndef BRAID_CAPI_LIMITS_H_
#define BRAID_CAPI_LIMITS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "comm/dtype.h"
#include "optim/sharded_optimizer.h"

namespace braid::capi {

// braid_optimizer_options_t.threads: [1, kMaxOptimizerThreads].
inline constexpr int kMaxOptimizerThreads = 256;
// braid_optimizer_options_t.num_groups: [1, kMaxParamGroups].
inline constexpr int kMaxParamGroups = 1 << 16;

// InvalidArgument "<prefix><field> must be finite, got inf" for the first non-finite field that
// `kind` uses (AdamW: lr, beta1, beta2, eps, weight_decay; SGD: lr, momentum, weight_decay).
// The ranges (lr >= 0, ...) are optim's CheckHyper; this adds what its comparisons let through.
absl::Status CheckHyperFinite(const optim::GroupHyper& h, optim::OptimizerKind kind,
                              absl::string_view prefix);

// InvalidArgument naming `what` (e.g. "params[3].count") when `count` elements of `dtype` plus
// `*total_bytes` before them exceed sched::kMaxPlanBytes (so no byte size can wrap); else adds
// the parameter's bytes to *total_bytes.
absl::Status AddParamBytes(size_t count, DType dtype, absl::string_view what, size_t* total_bytes);

}  // namespace braid::capi

#endif  // BRAID_CAPI_LIMITS_H_
