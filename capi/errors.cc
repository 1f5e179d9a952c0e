// Status mapping, the thread-local last error, and the version / status / dtype queries.
#include "capi/errors.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "capi/convert.h"
#include "comm/dtype.h"

namespace braid::capi {
namespace {

// This thread's last failure message (the one other piece of per-process state besides the
// handle registry; per thread, so it needs no lock).
std::string& LastError() {
  thread_local std::string last;
  return last;
}

#define BRAID_STR2(x) #x
#define BRAID_STR(x) BRAID_STR2(x)
constexpr char kVersion[] = BRAID_STR(BRAID_VERSION_MAJOR) "." BRAID_STR(
    BRAID_VERSION_MINOR) "." BRAID_STR(BRAID_VERSION_PATCH);

}  // namespace

braid_status_t ToCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return BRAID_OK;
    case absl::StatusCode::kInvalidArgument:
      return BRAID_INVALID_ARGUMENT;
    case absl::StatusCode::kNotFound:
      return BRAID_NOT_FOUND;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      return BRAID_FAILED_PRECONDITION;
    case absl::StatusCode::kOutOfRange:
      return BRAID_OUT_OF_RANGE;
    case absl::StatusCode::kDeadlineExceeded:
      return BRAID_TIMEOUT;
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnavailable:
      return BRAID_PEER_ERROR;
    case absl::StatusCode::kUnimplemented:
      return BRAID_UNIMPLEMENTED;
    case absl::StatusCode::kDataLoss:
      return BRAID_DATA_LOSS;
    default:
      return BRAID_INTERNAL;  // kInternal, kUnknown, kResourceExhausted
  }
}

braid_status_t Report(const char* fn, const absl::Status& status) {
  if (status.ok()) return BRAID_OK;
  LastError() = absl::StrCat(fn, ": ", status.message());
  return ToCode(status.code());
}

absl::Status CheckNotNull(const void* p, const char* arg) {
  if (p != nullptr) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("argument '", arg, "' is NULL"));
}

absl::Status ReadOptionBytes(const void* opts, size_t min_size, size_t known_size, const char* type,
                             void* out) {
  if (opts == nullptr) return absl::OkStatus();
  size_t size = 0;
  std::memcpy(&size, opts, sizeof(size));
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(type, ".struct_size is ", size, ": ", why, " (call ",
                     absl::string_view(type).substr(0, std::strlen(type) - 2),
                     "_init first; this library knows ", known_size, " bytes)"));
  };
  if (size == 0) return bad("not set");
  if (size < min_size) return bad("smaller than any known version of the struct");
  // A size this large is an uninitialized field, not a newer header.
  if (size > 64 * known_size) return bad("implausibly large (uninitialized?)");
  if (size > known_size) {
    const auto* tail = static_cast<const unsigned char*>(opts);
    for (size_t i = known_size; i < size; ++i) {
      if (tail[i] != 0) {
        return bad(absl::StrCat("the struct is larger than this library's and byte ", i,
                                " beyond it is set: the caller uses options of a newer Braid "
                                "that this library cannot honour"));
      }
    }
  }
  std::memcpy(out, opts, size < known_size ? size : known_size);
  std::memcpy(out, &known_size, sizeof(known_size));
  return absl::OkStatus();
}

absl::Status CheckKnownSize(const void* opts, std::initializer_list<size_t> older,
                            size_t known_size, const char* type) {
  if (opts == nullptr) return absl::OkStatus();
  size_t size = 0;
  std::memcpy(&size, opts, sizeof(size));
  if (size >= known_size) return absl::OkStatus();
  std::string sizes;
  for (size_t s : older) {
    if (s == size) return absl::OkStatus();
    absl::StrAppend(&sizes, s, ", ");
  }
  return absl::InvalidArgumentError(absl::StrCat(
      type, ".struct_size is ", size, ": not the size of any version of the struct (known: ", sizes,
      known_size, "; call ", absl::string_view(type).substr(0, std::strlen(type) - 2),
      "_init first)"));
}

absl::Status CheckTimeoutMs(int64_t ms, const char* what) {
  if (ms >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " must be >= 0, got ", ms));
}

}  // namespace braid::capi

using braid::capi::Guard;

extern "C" {

const char* braid_version(void) { return braid::capi::kVersion; }
int braid_abi_version(void) { return BRAID_ABI_VERSION; }

const char* braid_status_name(braid_status_t status) {
  switch (braid::capi::RawEnum(status)) {
    case BRAID_OK:
      return "BRAID_OK";
    case BRAID_IN_PROGRESS:
      return "BRAID_IN_PROGRESS";
    case BRAID_INVALID_ARGUMENT:
      return "BRAID_INVALID_ARGUMENT";
    case BRAID_NOT_FOUND:
      return "BRAID_NOT_FOUND";
    case BRAID_FAILED_PRECONDITION:
      return "BRAID_FAILED_PRECONDITION";
    case BRAID_OUT_OF_RANGE:
      return "BRAID_OUT_OF_RANGE";
    case BRAID_TIMEOUT:
      return "BRAID_TIMEOUT";
    case BRAID_PEER_ERROR:
      return "BRAID_PEER_ERROR";
    case BRAID_UNIMPLEMENTED:
      return "BRAID_UNIMPLEMENTED";
    case BRAID_DATA_LOSS:
      return "BRAID_DATA_LOSS";
    case BRAID_INTERNAL:
      return "BRAID_INTERNAL";
  }
  return "BRAID_UNKNOWN_STATUS";
}

const char* braid_last_error(void) {
  try {
    return braid::capi::LastError().c_str();
  } catch (...) {
    return "";
  }
}

void braid_clear_error(void) {
  try {
    braid::capi::LastError().clear();
  } catch (...) {
  }
}

size_t braid_dtype_size(braid_dtype_t dtype) {
  const int raw = braid::capi::RawEnum(dtype);
  return braid::IsValidDType(raw) ? braid::DTypeSize(static_cast<braid::DType>(raw)) : 0;
}

}  // extern "C"
