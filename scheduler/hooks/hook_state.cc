#include "scheduler/hooks/hook_state.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::sched {
namespace {
constexpr char kMagic[4] = {'B', 'R', 'H', 'S'};
// 2: the bucket layout's fingerprint after the rank (0.11; 1 lacked it and is refused).
constexpr int64_t kVersion = 2;
}  // namespace

HookStateWriter::HookStateWriter(absl::string_view hook, int group_size, int rank,
                                 uint64_t layout) {
  Raw(kMagic, sizeof kMagic);
  Int(kVersion);
  Int(static_cast<int64_t>(hook.size()));
  Raw(hook.data(), hook.size());
  Int(group_size);
  Int(rank);
  Int(static_cast<int64_t>(layout));
}

void HookStateWriter::Int(int64_t v) { Raw(&v, sizeof v); }

void HookStateWriter::Floats(const std::vector<float>& v) {
  Int(static_cast<int64_t>(v.size()));
  Raw(v.data(), v.size() * sizeof(float));
}

absl::Status HookStateReader::Raw(void* p, size_t n) {
  if (bytes_.size() - at_ < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("comm hook state: truncated at byte ", at_, " of ", bytes_.size()));
  }
  std::memcpy(p, bytes_.data() + at_, n);
  at_ += n;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> HookStateReader::Int() {
  int64_t v;
  RETURN_IF_ERROR(Raw(&v, sizeof v));
  return v;
}

absl::StatusOr<std::vector<float>> HookStateReader::Floats() {
  ASSIGN_OR_RETURN(int64_t n, Int());
  if (n < 0 || static_cast<size_t>(n) > (bytes_.size() - at_) / sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("comm hook state: a vector of ", n,
                                                   " floats at byte ", at_, " of ", bytes_.size()));
  }
  std::vector<float> v(static_cast<size_t>(n));
  RETURN_IF_ERROR(Raw(v.data(), v.size() * sizeof(float)));
  return v;
}

absl::StatusOr<HookStateReader> HookStateReader::Open(absl::string_view bytes,
                                                      absl::string_view hook, int group_size,
                                                      int rank) {
  HookStateReader r(bytes);
  char magic[4];
  if (!r.Raw(magic, sizeof magic).ok() || std::memcmp(magic, kMagic, sizeof magic) != 0) {
    return absl::InvalidArgumentError("comm hook state: not a Braid comm hook state");
  }
  ASSIGN_OR_RETURN(int64_t version, r.Int());
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "comm hook state: version ", version, "; this Braid reads version ", kVersion,
        version < kVersion ? " only (older states do not record the bucket layout their per-bucket "
                             "records belong to: load the checkpoint without the hook state, and "
                             "the hook restarts its warm-up)"
                           : " only"));
  }
  ASSIGN_OR_RETURN(int64_t len, r.Int());
  if (len < 0 || static_cast<size_t>(len) > bytes.size() - r.at_) {
    return absl::InvalidArgumentError("comm hook state: truncated hook name");
  }
  const std::string name(bytes.substr(r.at_, static_cast<size_t>(len)));
  r.at_ += static_cast<size_t>(len);
  ASSIGN_OR_RETURN(int64_t size, r.Int());
  ASSIGN_OR_RETURN(int64_t saved_rank, r.Int());
  ASSIGN_OR_RETURN(int64_t layout, r.Int());
  r.layout_ = static_cast<uint64_t>(layout);
  if (name != hook) {
    return absl::FailedPreconditionError(absl::StrCat(
        "comm hook state: saved by the '", name, "' hook; this reducer's hook is '", hook, "'"));
  }
  if (size != group_size || saved_rank != rank) {
    return absl::FailedPreconditionError(absl::StrCat(
        "comm hook state of '", hook, "': saved by rank ", saved_rank, " of ", size,
        "; this is rank ", rank, " of ", group_size,
        ". The state (error feedback, warm starts) follows each rank's elements and cannot be "
        "resharded: load the checkpoint without it, and the hook restarts its warm-up"));
  }
  return r;
}

}  // namespace braid::sched
