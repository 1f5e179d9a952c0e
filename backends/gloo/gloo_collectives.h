// One Braid collective run to completion on a Gloo context (blocking; called on a group's
// SerialWorker). Braid's reduction semantics (comm/reduce_op.h) out of Gloo's all-reduce:
//
//   dtype      op          before Gloo                          Gloo reduces   after
//   bf16/f16   any         widen into f32 staging (premul: x    f32 sum /      narrow once into
//                          its own scalar)                      max / min      recv (avg: / n)
//   f32/f64    premul_sum  x scalar into recv (or staging)      sum            -
//   f32/f64    avg         copy into recv (or staging)          sum            / n
//   integers   sum/max/min copy into recv (or staging)          same           -
//   bf16/f16   sum/avg/    copy (premul: x its own scalar,      half sum:      avg: / n
//   half_wire  premul      rounded to dtype) into staging       f32 per hop
// half_wire (CollectiveOptions): 2 bytes per element; each hop widens both operands to f32,
// adds and rounds back (NCCL's half sum), in the association of Gloo's ring.
//
// The element-wise reduction Gloo calls is ours, in the wire type, so every Braid dtype is
// supported; a dtype this file does not know is refused with Unimplemented naming it.
// Reduce-scatter has no new-style Gloo algorithm in this Gloo: it is an all-reduce of the
// whole input in staging, then this rank's block is copied out (the traffic of an all-reduce,
// not of a reduce-scatter: fine for a CPU backend's role, noted in the backend's header).
// Gloo's ring adds in its own order, not rank order: results match the serial reference bit
// for bit only where partial sums are exact (the tests' exact data), as with MPI.
//
//   RETURN_IF_ERROR(RunCollective(*ctx, args, /*tag=*/seq, absl::Seconds(30), "allreduce #3"));
#ifndef BRAID_BACKENDS_GLOO_GLOO_COLLECTIVES_H_
#define BRAID_BACKENDS_GLOO_GLOO_COLLECTIVES_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/group.h"
#include "gloo/context.h"

namespace braid::gloo_backend {

// OK for the dtypes this backend moves (all seven of comm/dtype.h); Unimplemented naming the
// dtype's value otherwise (a dtype added to Braid later, until this file learns it).
absl::Status CheckDType(DType dtype);

// Runs `args` on `ctx` with Gloo tag `tag` and `timeout` as Gloo's end-to-end limit. Errors
// name `what` (the op, its sequence number and group) and carry Gloo's text.
absl::Status RunCollective(const std::shared_ptr<::gloo::Context>& ctx, const CollectiveArgs& args,
                           uint32_t tag, absl::Duration timeout, absl::string_view what);

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_GLOO_COLLECTIVES_H_
