#include "backends/mpi/group_state.h"

#include "absl/strings/str_cat.h"

namespace braid::mpi {

absl::Status GroupState::CheckUsableLocked() const {
  if (!failure.ok()) {
    return absl::Status(failure.code(),
                        absl::StrCat("group '", name, "' has failed and refuses new calls; cause: ",
                                     failure.message()));
  }
  if (closed) {
    return absl::CancelledError(absl::StrCat("group '", name, "' was destroyed"));
  }
  return absl::OkStatus();
}

}  // namespace braid::mpi
