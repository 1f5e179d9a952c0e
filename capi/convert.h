// C values -> Braid's C++ values, shared by the shim's files.
//
// Enums: C lets a caller pass any int where a braid_*_t enum is expected; C++ does not (a
// value outside the enumeration is undefined behaviour once loaded as the enum type). So the
// shim never loads a caller's enum as its enum type: RawEnum copies its bytes into an int,
// and every conversion range-checks that int (errors name the value and the type).
#ifndef BRAID_CAPI_CONVERT_H_
#define BRAID_CAPI_CONVERT_H_

#include <cstring>

#include "absl/status/statusor.h"
#include "capi/braid.h"
#include "comm/dtype.h"
#include "scheduler/gradient_reducer.h"

namespace braid::capi {

template <typename Enum>
int RawEnum(const Enum& e) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are int-sized on every supported ABI");
  int raw;
  std::memcpy(&raw, &e, sizeof(raw));
  return raw;
}

// InvalidArgument "<what> 42 is not a braid_dtype_t".
absl::StatusOr<DType> ToDType(int raw, const char* what);
absl::StatusOr<sched::SyncMode> ToSyncMode(int raw);

}  // namespace braid::capi

#endif  // BRAID_CAPI_CONVERT_H_
