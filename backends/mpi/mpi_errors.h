// MPI return codes turned into absl::Status, once, at the edge of the mpi backend.
//
//   RETURN_IF_MPI_ERROR(MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, comm, &req));
//   absl::Status s = MpiStatus(rc, "MPI_Comm_split");  // OK when rc == MPI_SUCCESS
//
// The status carries the failed call's text and MPI's own message (MPI_Error_string), with a
// code from the MPI error class (bad arguments -> InvalidArgument, no memory ->
// ResourceExhausted, anything else -> Internal). Nothing else in the backend looks at raw MPI
// return codes.
//
// An MPI error reaches this code only if the error handler MPI invokes for it returns:
//   - calls on the backend's own communicators: they use MPI_ERRORS_RETURN (MpiComm::Adopt);
//   - completing a request (MPI_Testsome in the progress engine; e.g. MPI_ERR_TRUNCATE when
//     ranks pass different counts to a collective without BRAID_VALIDATE_COLLECTIVES): Open MPI
//     raises these on MPI_COMM_WORLD's handler, not on the collective's communicator. When the
//     backend initialized MPI it set MPI_ERRORS_RETURN on MPI_COMM_WORLD and MPI_COMM_SELF
//     (mpi_runtime.h), so the error fails that collective's Work (naming the op and MPI's text)
//     and its group. When the host application initialized MPI the backend leaves the host's
//     handlers alone: under MPI's default MPI_ERRORS_ARE_FATAL such an error aborts the whole
//     job. A host that wants these as statuses calls
//     MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) itself.
// What MPI never reports is not covered here: a rank that does not make the call (only the
// deadline sees it), or a process that dies (Open MPI's launcher aborts the job).
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
