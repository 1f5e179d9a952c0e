// Status propagation helpers (the packaged Abseil 20220623 predates absl/status/status_macros.h).
//
//   absl::StatusOr<int> Parse(absl::string_view s);
//   absl::Status Use(absl::string_view s) {
//     ASSIGN_OR_RETURN(int n, Parse(s));
//     RETURN_IF_ERROR(Check(n));
//     return absl::OkStatus();
//   }
#ifndef BRAID_COMM_STATUS_MACROS_H_
#define BRAID_COMM_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define BRAID_STATUS_CONCAT_INNER(a, b) a##b
#define BRAID_STATUS_CONCAT(a, b) BRAID_STATUS_CONCAT_INNER(a, b)

// Evaluates `expr` (an absl::Status) once and returns it from the enclosing function if not OK.
#define RETURN_IF_ERROR(expr)                              \
  do {                                                     \
    ::absl::Status braid_status_tmp_ = (expr);             \
    if (!braid_status_tmp_.ok()) return braid_status_tmp_; \
  } while (0)

// `ASSIGN_OR_RETURN(lhs, rexpr)`: evaluates `rexpr` (an absl::StatusOr<T>); on error returns its
// status, else moves the value into `lhs` (which may be a declaration such as `auto x`).
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  BRAID_ASSIGN_OR_RETURN_IMPL(BRAID_STATUS_CONCAT(braid_statusor_, __LINE__), lhs, rexpr)

#define BRAID_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr)  \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace braid {

// `s` with "<context>: " before its message, same code; OK stays OK.
//   return WithContext(ops.Zero(p, n), absl::StrCat("zeroing ", label));
inline absl::Status WithContext(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(context, ": ", s.message()));
}

}  // namespace braid

#endif  // BRAID_COMM_STATUS_MACROS_H_
