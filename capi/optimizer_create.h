// What braid_optimizer_create makes of its options, shared with braid_optimizer_create_linked:
// the parameter side's options (optimizer config, units, gather stream) for one reducer's stack.
//
//   optim::OptimizerKind kind;
//   ASSIGN_OR_RETURN(optim::ParamOptions po, ToParamOptions(stack, opts, &kind));
//   RETURN_IF_ERROR(stack.AddParamSide(po));
//
// Contract: reads a versioned braid_optimizer_options_t (NULL: the defaults); INVALID_ARGUMENT
// names the field ("opts->lr must be finite"). Changes nothing.
#ifndef BRAID_CAPI_OPTIMIZER_CREATE_H_
#define BRAID_CAPI_OPTIMIZER_CREATE_H_

#include "absl/status/statusor.h"
#include "capi/braid.h"
#include "optim/training_stack.h"

namespace braid::capi {

absl::StatusOr<optim::ParamOptions> ToParamOptions(optim::TrainingStack& stack,
                                                   const braid_optimizer_options_t* opts,
                                                   optim::OptimizerKind* kind);

}  // namespace braid::capi

#endif  // BRAID_CAPI_OPTIMIZER_CREATE_H_
