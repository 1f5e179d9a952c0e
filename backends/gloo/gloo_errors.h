// Gloo's exceptions -> absl::Status, once, at the backend's edge (Gloo reports every failure
// by throwing: gloo::IoException for transport errors and timeouts, gloo::EnforceNotMet for
// broken preconditions).
//
//   absl::Status s = GlooCall("allreduce #3 on group 'world'", [&] { gloo::allreduce(opts); });
//
// Mapping: an IoException whose text says it timed out -> DeadlineExceeded; other
// IoExceptions -> Unavailable (a peer went away); anything else Gloo or the standard library
// throws -> Internal. The message carries `what` and Gloo's own text. Nothing escapes.
#ifndef BRAID_BACKENDS_GLOO_GLOO_ERRORS_H_
#define BRAID_BACKENDS_GLOO_GLOO_ERRORS_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace braid::gloo_backend {

absl::Status GlooCall(absl::string_view what, const std::function<void()>& call);

}  // namespace braid::gloo_backend

#endif  // BRAID_BACKENDS_GLOO_GLOO_ERRORS_H_
