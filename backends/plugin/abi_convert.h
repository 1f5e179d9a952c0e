// Conversions between Braid's C++ vocabulary and the plain C values of braid_backend_v1.h.
// The host side (the `plugin` backend) and C++ plugins that wrap Braid types both use them,
// so a value means the same on both sides of the boundary.
//
//   int dtype = ToAbiDType(DType::kBF16);                     // BRAID_BACKEND_BF16
//   ASSIGN_OR_RETURN(DType t, FromAbiDType(dtype));           // InvalidArgument if unknown
//   return ReportAbiError(status, error);                     // plugin side: code + message
//   absl::Status s = FromAbiStatus(code, message);            // host side: back to absl
//
// Status mapping, both ways:
//   BRAID_BACKEND_INVALID_ARGUMENT  <-> InvalidArgument (also from OutOfRange, FailedPrecondition)
//   BRAID_BACKEND_UNIMPLEMENTED     <-> Unimplemented
//   BRAID_BACKEND_TIMEOUT           <-> DeadlineExceeded
//   BRAID_BACKEND_PEER_FAILURE      <-> Aborted (also from Cancelled, Unavailable)
//   BRAID_BACKEND_INTERNAL          <-> Internal (and every other code)
#ifndef BRAID_BACKENDS_PLUGIN_ABI_CONVERT_H_
#define BRAID_BACKENDS_PLUGIN_ABI_CONVERT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "backends/plugin/braid_backend_v1.h"
#include "comm/dtype.h"
#include "comm/group.h"
#include "comm/reduce_op.h"

namespace braid::plugin {

int ToAbiDType(DType t);
absl::StatusOr<DType> FromAbiDType(int raw);  // InvalidArgument naming the value

int ToAbiReduceKind(ReduceKind k);
absl::StatusOr<ReduceKind> FromAbiReduceKind(int raw);  // InvalidArgument naming the value

// BRAID_BACKEND_OK for OK, else the code of the table above.
int ToAbiStatus(const absl::Status& s);
// The absl status for `code`; `message` (may be null) becomes its message. An unknown nonzero
// code is Internal and the message names it.
absl::Status FromAbiStatus(int code, const char* message);

// The message a plugin left in `error`: up to its first NUL, or all of the buffer when the
// plugin wrote none (the ABI asks for a NUL-terminated message; the host does not trust it).
absl::string_view AbiErrorText(const braid_backend_error_v1& error);

// Plugin side of a failing entry: writes s.message() (truncated, NUL-terminated) into
// `error` when it is non-null and returns ToAbiStatus(s). OK returns BRAID_BACKEND_OK and
// leaves `error` alone.
int ReportAbiError(const absl::Status& s, braid_backend_error_v1* error);

uint64_t ToAbiCapabilities(const Capabilities& c);
// `split` says whether the table has comm_split; unknown bits are ignored. device_events is
// always false: v1 launches carry no device event.
Capabilities FromAbiCapabilities(uint64_t bits, bool split);

}  // namespace braid::plugin

#endif  // BRAID_BACKENDS_PLUGIN_ABI_CONVERT_H_
