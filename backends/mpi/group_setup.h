// The calls that build groups, each under a deadline like a collective, so a rank that never
// arrives is an error rather than a hang:
//   DupComm          MPI_Comm_idup: a private communicator (the world group does not use
//                    MPI_COMM_WORLD itself, which the host application may also use);
//   ExchangeRecords  MPI_Iallgather of one CallRecord per rank on the group's control
//                    communicator: the first half of Split.
// They block the calling thread, driving progress while they wait.
//
//   ASSIGN_OR_RETURN(MpiComm data, DupComm(runtime, MPI_COMM_WORLD, {"world", "create"}, 60s));
//   ASSIGN_OR_RETURN(std::vector<CallRecord> table,
//                    ExchangeRecords(runtime, state, info, timeout, SplitRecord(c, k, rank)));
#ifndef BRAID_BACKENDS_MPI_GROUP_SETUP_H_
#define BRAID_BACKENDS_MPI_GROUP_SETUP_H_

#include <mpi.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "backends/mpi/call_record.h"
#include "backends/mpi/group_state.h"
#include "backends/mpi/mpi_comm.h"
#include "backends/mpi/mpi_runtime.h"
#include "comm/work.h"

namespace braid::mpi {

// A duplicate of `parent`, owned. `info` names the step in errors.
absl::StatusOr<MpiComm> DupComm(const std::shared_ptr<MpiRuntime>& runtime, MPI_Comm parent,
                                WorkInfo info, absl::Duration timeout);

// Every rank's record, in group rank order. A timeout fails `state`'s group.
absl::StatusOr<std::vector<CallRecord>> ExchangeRecords(const std::shared_ptr<MpiRuntime>& runtime,
                                                        std::shared_ptr<GroupState> state,
                                                        WorkInfo info, absl::Duration timeout,
                                                        const CallRecord& mine);

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_GROUP_SETUP_H_
