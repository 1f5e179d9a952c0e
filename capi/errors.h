// The C boundary's error half: absl::Status -> braid_status_t, this thread's last-error
// message, the exception guard every entry point runs in, and option-struct size checks.
//
//   braid_status_t braid_group_rank(braid_group_t* group, int* rank) {
//     return Guard("braid_group_rank", [&]() -> absl::Status {
//       ASSIGN_OR_RETURN(auto g, Find<GroupImpl>(group, "group"));
//       RETURN_IF_ERROR(CheckOut(rank, "rank"));
//       *rank = g->group->rank();
//       return absl::OkStatus();
//     });
//   }
//
// Every message is "<function>: <problem>", so the caller's log names the entry point.
#ifndef BRAID_CAPI_ERRORS_H_
#define BRAID_CAPI_ERRORS_H_

#include <cstddef>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "capi/braid.h"
#include "comm/status_macros.h"

namespace braid::capi {

// The documented mapping (braid.h, braid_status_t).
braid_status_t ToCode(absl::StatusCode code);

// Sets this thread's last error to "<fn>: <message>" and returns the code; OK -> BRAID_OK with
// the last error unchanged.
braid_status_t Report(const char* fn, const absl::Status& status);

// Runs `body` (returning absl::Status) and reports its outcome; nothing escapes: a C++
// exception becomes BRAID_INTERNAL naming it.
template <typename Body>
braid_status_t Guard(const char* fn, Body&& body) noexcept {
  try {
    return Report(fn, body());
  } catch (const std::bad_alloc&) {
    return Report(fn, absl::ResourceExhaustedError("out of memory"));
  } catch (const std::exception& e) {
    return Report(fn, absl::InternalError(absl::StrCat("C++ exception: ", e.what())));
  } catch (...) {
    return Report(fn, absl::InternalError("unknown C++ exception"));
  }
}

// InvalidArgument "argument '<arg>' is NULL" unless `p` is set.
absl::Status CheckNotNull(const void* p, const char* arg);

// Reads a caller's option struct (which begins with size_t struct_size) into `*out`, whose
// fields already hold the defaults. `opts` NULL: the defaults. Sizes accepted: `min_size` (the
// first version of the struct) up to sizeof(T), copied as a prefix (fields beyond it keep their
// defaults), or larger when every byte past sizeof(T) is zero (a newer header's fields left at
// their zero defaults). Anything else: InvalidArgument naming `type` and the size.
absl::Status ReadOptionBytes(const void* opts, size_t min_size, size_t known_size, const char* type,
                             void* out);
template <typename T>
absl::Status ReadOptions(const T* opts, const char* type, T* out) {
  return ReadOptionBytes(opts, sizeof(T), sizeof(T), type, out);
}
// For a struct with several versions (fields appended): `older` lists the sizes of the earlier
// versions (offsetof the first field each later version added). A caller's size below sizeof(T)
// must be one of them exactly (a size inside a field is a mismatched header, not a version).
absl::Status CheckKnownSize(const void* opts, std::initializer_list<size_t> older,
                            size_t known_size, const char* type);
template <typename T>
absl::Status ReadVersionedOptions(const T* opts, std::initializer_list<size_t> older,
                                  const char* type, T* out) {
  size_t min_size = sizeof(T);
  for (size_t s : older) min_size = s < min_size ? s : min_size;
  RETURN_IF_ERROR(ReadOptionBytes(opts, min_size, sizeof(T), type, out));
  return CheckKnownSize(opts, older, sizeof(T), type);
}

// Milliseconds from the C API to a Duration; `what` names the field. InvalidArgument if < 0.
absl::Status CheckTimeoutMs(int64_t ms, const char* what);

}  // namespace braid::capi

#endif  // BRAID_CAPI_ERRORS_H_
