// The names users call, as error messages cite them. A message that reaches a caller names the
// C entry point (braid.h; the Python binding's methods carry the same names without the
// `braid_<object>_` prefix), never a C++ method: the C boundary prefixes the entry point that
// failed ("braid_reducer_mark_ready: parameter w1 ..."), and a message pointing at another call
// spells it as here.
//
//   return absl::FailedPreconditionError(
//       absl::StrCat("outside a backward: call ", kBeginBackward, " first"));
#ifndef BRAID_SCHEDULER_USER_CALLS_H_
#define BRAID_SCHEDULER_USER_CALLS_H_

namespace braid::sched {

// Starting a backward: the reducer's call, or the optimizer's once one is built on it.
inline constexpr char kBeginBackward[] =
    "braid_reducer_begin_backward (braid_optimizer_begin_backward with an optimizer)";

}  // namespace braid::sched

#endif  // BRAID_SCHEDULER_USER_CALLS_H_
