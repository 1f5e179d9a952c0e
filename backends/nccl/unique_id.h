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
//
// Under torchrun / srun (no MPI), ExchangeUniqueId does the same through the rendezvous store
// (backends/rendezvous): rank 0 sets "<prefix>/unique_id", the others wait for it (deadline:
// the store's timeout), and a failure on rank 0 is published in place of the id, so the others
// fail with it at once instead of at the deadline.
#ifndef BRAID_BACKENDS_NCCL_UNIQUE_ID_H_
#define BRAID_BACKENDS_NCCL_UNIQUE_ID_H_

#include <nccl.h>

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "backends/nccl/nccl_api.h"
#include "backends/rendezvous/store_client.h"
#include "comm/group.h"

namespace braid::nccl {

inline constexpr size_t kUniqueIdBytes = NCCL_UNIQUE_ID_BYTES;

// ncclGetUniqueId, as kUniqueIdBytes bytes. FailedPrecondition when NCCL cannot be loaded
// (NcclApi::Ready). Needs no GPU.
absl::StatusOr<std::string> NewUniqueIdBytes(NcclApi& nccl);
// InvalidArgument naming both lengths unless `bytes` holds exactly kUniqueIdBytes.
absl::StatusOr<ncclUniqueId> UniqueIdFromBytes(absl::string_view bytes);
// Collective over `group` (host buffers): its rank 0 makes the id, every rank returns it.
absl::StatusOr<ncclUniqueId> BroadcastUniqueId(Group& group, NcclApi& nccl, absl::Duration timeout);

// Through `store` (every rank of `world_size` calls it with the same prefix): rank 0 makes the
// id and sets it, every rank returns it; rank 0 returns once every other rank has read it (it
// serves the store). DeadlineExceeded naming the keys when rank 0 never published or a rank
// never read; Unavailable carrying rank 0's error when it could not make one.
absl::StatusOr<ncclUniqueId> ExchangeUniqueId(rendezvous::TcpStore& store, absl::string_view prefix,
                                              int rank, int world_size, NcclApi& nccl);

}  // namespace braid::nccl

#endif  // BRAID_BACKENDS_NCCL_UNIQUE_ID_H_
