// GroupState: the part of an mpi group that its in-flight operations share with it.
//
// An operation can outlive its Group object (the caller may drop the group while work is in
// flight), so operations hold this small shared state instead of the group:
//
//   std::lock_guard<std::mutex> lock(engine.mu());        // every field below but the constants
//   RETURN_IF_ERROR(state->CheckUsableLocked());          // failed or destroyed: refuse new calls
//   MPI_Iallreduce(..., state->data, &request);
//
// A group fails (stickily) when one of its operations misses its deadline or gets an MPI
// error: MPI cannot cancel a collective, so the communicator's call order is no longer known
// to match the peers' and every later call fails fast with the cause.
#ifndef BRAID_BACKENDS_MPI_GROUP_STATE_H_
#define BRAID_BACKENDS_MPI_GROUP_STATE_H_

#include <mpi.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace braid::mpi {

struct GroupState {
  GroupState(std::string name, int rank, int size, bool validate)
      : name(std::move(name)), rank(rank), size(size), validate(validate) {}

  const std::string name;
  const int rank;
  const int size;
  const bool validate;  // BRAID_VALIDATE_COLLECTIVES: exchange call records before collectives

  // Guarded by the MPI lock (ProgressEngine::mu()).
  MPI_Comm data = MPI_COMM_NULL;     // collectives only, in the order they are issued
  MPI_Comm control = MPI_COMM_NULL;  // call-record and Split exchanges, MPI_Comm_split
  uint64_t next_data_turn = 0;       // validate: turn of the next collective allowed on `data`
  absl::Status failure;              // sticky: the first deadline or MPI error
  bool closed = false;               // the Group object was destroyed; its comms are freed

  // Records the first failure; later ones keep the original cause.
  void MarkFailedLocked(const absl::Status& cause) {
    if (failure.ok() && !cause.ok()) failure = cause;
  }
  // OK while new MPI calls may be issued on this group.
  absl::Status CheckUsableLocked() const;
};

}  // namespace braid::mpi

#endif  // BRAID_BACKENDS_MPI_GROUP_STATE_H_
