#include "backends/mpi/mpi_errors.h"

#include <mpi.h>

#include "absl/strings/str_cat.h"

namespace braid::mpi {
namespace {

absl::StatusCode CodeForClass(int error_class) {
  switch (error_class) {
    case MPI_ERR_BUFFER:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_TAG:
    case MPI_ERR_COMM:
    case MPI_ERR_RANK:
    case MPI_ERR_ROOT:
    case MPI_ERR_OP:
    case MPI_ERR_ARG:
    case MPI_ERR_TRUNCATE:
    case MPI_ERR_GROUP:
      return absl::StatusCode::kInvalidArgument;
    case MPI_ERR_NO_MEM:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status MpiStatus(int rc, absl::string_view call) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  int error_class = MPI_ERR_UNKNOWN;
  if (MPI_Error_class(rc, &error_class) != MPI_SUCCESS) error_class = MPI_ERR_UNKNOWN;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  // Open MPI's libnbc reports a schedule it aborted (a subrequest failed, e.g. truncated)
  // as OMPI_ERROR (-1), which has no text: say so, rather than print an empty reason.
  const absl::string_view reason =
      len > 0 ? absl::string_view(text, len)
              : absl::string_view(
                    "MPI gave no text for this code (Open MPI's libnbc returns -1 "
                    "when it aborts a collective's schedule; its cause is on stderr)");
  return absl::Status(CodeForClass(error_class),
                      absl::StrCat(call, " failed: ", reason, " (MPI error ", rc, ")"));
}

}  // namespace braid::mpi
