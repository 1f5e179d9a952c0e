#include "backends/plugin/abi_convert.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace braid::plugin {

// The ABI promises Braid's own numbering; keep the two in lockstep.
static_assert(BRAID_BACKEND_F32 == static_cast<int>(DType::kF32));
static_assert(BRAID_BACKEND_F64 == static_cast<int>(DType::kF64));
static_assert(BRAID_BACKEND_BF16 == static_cast<int>(DType::kBF16));
static_assert(BRAID_BACKEND_F16 == static_cast<int>(DType::kF16));
static_assert(BRAID_BACKEND_I32 == static_cast<int>(DType::kI32));
static_assert(BRAID_BACKEND_I64 == static_cast<int>(DType::kI64));
static_assert(BRAID_BACKEND_U8 == static_cast<int>(DType::kU8));
static_assert(BRAID_BACKEND_SUM == static_cast<int>(ReduceKind::kSum));
static_assert(BRAID_BACKEND_AVG == static_cast<int>(ReduceKind::kAvg));
static_assert(BRAID_BACKEND_PREMUL_SUM == static_cast<int>(ReduceKind::kPreMulSum));
static_assert(BRAID_BACKEND_MAX == static_cast<int>(ReduceKind::kMax));
static_assert(BRAID_BACKEND_MIN == static_cast<int>(ReduceKind::kMin));

int ToAbiDType(DType t) { return static_cast<int>(t); }

absl::StatusOr<DType> FromAbiDType(int raw) {
  if (!IsValidDType(raw)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype value ", raw));
  }
  return static_cast<DType>(raw);
}

int ToAbiReduceKind(ReduceKind k) { return static_cast<int>(k); }

absl::StatusOr<ReduceKind> FromAbiReduceKind(int raw) {
  for (ReduceKind k : kAllReduceKinds) {
    if (static_cast<int>(k) == raw) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown reduce op value ", raw));
}

int ToAbiStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return BRAID_BACKEND_OK;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return BRAID_BACKEND_INVALID_ARGUMENT;
    case absl::StatusCode::kUnimplemented:
      return BRAID_BACKEND_UNIMPLEMENTED;
    case absl::StatusCode::kDeadlineExceeded:
      return BRAID_BACKEND_TIMEOUT;
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kUnavailable:
      return BRAID_BACKEND_PEER_FAILURE;
    default:
      return BRAID_BACKEND_INTERNAL;
  }
}

absl::Status FromAbiStatus(int code, const char* message) {
  const absl::string_view text = message != nullptr ? message : "";
  switch (code) {
    case BRAID_BACKEND_OK:
      return absl::OkStatus();
    case BRAID_BACKEND_INVALID_ARGUMENT:
      return absl::InvalidArgumentError(text);
    case BRAID_BACKEND_UNIMPLEMENTED:
      return absl::UnimplementedError(text);
    case BRAID_BACKEND_TIMEOUT:
      return absl::DeadlineExceededError(text);
    case BRAID_BACKEND_PEER_FAILURE:
      return absl::AbortedError(text);
    case BRAID_BACKEND_INTERNAL:
      return absl::InternalError(text);
    default:
      return absl::InternalError(absl::StrCat("unknown status code ", code, ": ", text));
  }
}

absl::string_view AbiErrorText(const braid_backend_error_v1& error) {
  return absl::string_view(error.message, strnlen(error.message, sizeof(error.message)));
}

int ReportAbiError(const absl::Status& s, braid_backend_error_v1* error) {
  if (s.ok()) return BRAID_BACKEND_OK;
  if (error != nullptr) {
    const size_t n = std::min(s.message().size(), sizeof(error->message) - 1);
    if (n > 0)
      std::memcpy(error->message, s.message().data(), n);  // an empty message's data() may be null
    error->message[n] = '\0';
  }
  return ToAbiStatus(s);
}

uint64_t ToAbiCapabilities(const Capabilities& c) {
  uint64_t bits = 0;
  if (c.host_memory) bits |= BRAID_BACKEND_CAP_HOST_MEMORY;
  if (c.device_memory) bits |= BRAID_BACKEND_CAP_DEVICE_MEMORY;
  if (c.native_avg) bits |= BRAID_BACKEND_CAP_NATIVE_AVG;
  if (c.native_premul_sum) bits |= BRAID_BACKEND_CAP_NATIVE_PREMUL_SUM;
  if (c.native_half) bits |= BRAID_BACKEND_CAP_NATIVE_HALF;
  if (c.async_progress) bits |= BRAID_BACKEND_CAP_ASYNC_PROGRESS;
  if (c.deterministic) bits |= BRAID_BACKEND_CAP_DETERMINISTIC;
  return bits;
}

Capabilities FromAbiCapabilities(uint64_t bits, bool split) {
  Capabilities c;
  c.host_memory = (bits & BRAID_BACKEND_CAP_HOST_MEMORY) != 0;
  c.device_memory = (bits & BRAID_BACKEND_CAP_DEVICE_MEMORY) != 0;
  c.device_events = false;
  c.native_avg = (bits & BRAID_BACKEND_CAP_NATIVE_AVG) != 0;
  c.native_premul_sum = (bits & BRAID_BACKEND_CAP_NATIVE_PREMUL_SUM) != 0;
  c.native_half = (bits & BRAID_BACKEND_CAP_NATIVE_HALF) != 0;
  c.async_progress = (bits & BRAID_BACKEND_CAP_ASYNC_PROGRESS) != 0;
  c.split = split;
  c.deterministic = (bits & BRAID_BACKEND_CAP_DETERMINISTIC) != 0;
  return c;
}

}  // namespace braid::plugin
