// The NCCL unique id as bytes: how a world's ranks agree on it out of band.
//
//   // rank 0:
//   ASSIGN_OR_RETURN(std::string id, NewUniqueIdBytes(*apis.nccl));   // 128 bytes
//   store.Set("nccl_id", id);                          // the framework's own store / C API
//   // every rank:
//   ASSIGN_OR_RETURN(ncclUniqueId uid, UniqueIdFromBytes(store.Get("nccl_id")));
//
// Or, with a CPU group already connecting the ranks (the `mpi` backend's world under mpirun,
// or a `local` world in tests), BroadcastUniqueId makes it on the group's rank 0 and sends it
// to the others. If rank 0 cannot make one, every rank gets that error (a flag travels with the
// bytes) instead of waiting.
#ifndef BRAID_BACKENDS_NCCL_UNIQUE_ID_H_
#define BRAID_BACKENDS_NCCL_UNIQUE_ID_H_

#include <nccl.h>

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "backends/nccl/nccl_api.h"
#include "comm/group.h"

namespace braid::nccl {

inline constexpr size_t kUniqueIdBytes = NCCL_UNIQUE_ID_BYTES;

// ncclGetUniqueId, as kUniqueIdBytes bytes. FailedPrecondition when NCCL cannot be loaded
// (NcclApi::Ready). Needs no GPU.
absl::StatusOr<std::string> NewUniqueIdBytes(NcclApi& nccl);
// InvalidArgument naming both lengths unless `bytes` holds exactly kUniqueIdBytes.
absl::StatusOr<ncclUniqueId> UniqueIdFromBytes(absl::string_view bytes);
// Collective over `group` (host buffers): its rank 0 makes the id, every rank returns it.
absl::StatusOr<ncclUniqueId> BroadcastUniqueId(Group& group, NcclApi& nccl,
                                               absl::Duration timeout);

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_UNIQUE_ID_H_
