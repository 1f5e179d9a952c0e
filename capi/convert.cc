#include "capi/convert.h"

#include "absl/strings/str_cat.h"

namespace braid::capi {

absl::StatusOr<DType> ToDType(int raw, const char* what) {
  if (!IsValidDType(raw)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", raw, " is not a braid_dtype_t"));
  }
  return static_cast<DType>(raw);
}

absl::StatusOr<sched::SyncMode> ToSyncMode(int raw) {
  switch (raw) {
    case BRAID_SYNC:
      return sched::SyncMode::kSync;
    case BRAID_NO_SYNC:
      return sched::SyncMode::kNoSync;
    case BRAID_REDUCE_SCATTER_ONLY:
      return sched::SyncMode::kReduceScatterOnly;
  }
  return absl::InvalidArgumentError(absl::StrCat("mode ", raw, " is not a braid_sync_mode_t"));
}

}  // namespace braid::capi
