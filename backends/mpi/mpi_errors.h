// MPI return codes turned into absl::Status, once, at the edge of the mpi backend.
//
//   RETURN_IF_MPI_ERROR(MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, comm, &req));
//   absl::Status s = MpiStatus(rc, "MPI_Comm_split");  // OK when rc == MPI_SUCCESS
//
// The status carries the failed call's text and MPI's own message (MPI_Error_string), with a
// code from the MPI error class (bad arguments -> InvalidArgument, no memory ->
// ResourceExhausted, anything else -> Internal). Nothing else in the backend looks at raw MPI
// return codes. Our communicators use MPI_ERRORS_RETURN, so MPI errors arrive here instead of
// aborting the job.
#ifndef BRAID_BACKENDS_MPI_MPI_ERRORS_H_
#define BRAID_BACKENDS_MPI_MPI_ERRORS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "comm/status_macros.h"

namespace braid::mpi {

// OK for MPI_SUCCESS; otherwise an error naming `call` and MPI's description of `rc`.
absl::Status MpiStatus(int rc, absl::string_view call);

}  // namespace braid::mpi

// Evaluates an MPI call once; returns its error status from the enclosing function.
#define RETURN_IF_MPI_ERROR(call) RETURN_IF_ERROR(::braid::mpi::MpiStatus((call), #call))

#endif  // BRAID_BACKENDS_MPI_MPI_ERRORS_H_
