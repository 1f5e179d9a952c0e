#include "backends/nccl/unique_id.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/nccl/errors.h"
#include "comm/status_macros.h"

namespace braid::nccl {

absl::StatusOr<std::string> NewUniqueIdBytes(NcclApi& nccl) {
  RETURN_IF_ERROR(nccl.Ready());
  ncclUniqueId id;
  RETURN_IF_ERROR(NcclStatus(nccl, nccl.GetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(id.internal, kUniqueIdBytes);
}

absl::StatusOr<ncclUniqueId> UniqueIdFromBytes(absl::string_view bytes) {
  if (bytes.size() != kUniqueIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL unique id: expected ", kUniqueIdBytes,
                                                   " bytes (from ncclGetUniqueId), got ",
                                                   bytes.size()));
  }
  ncclUniqueId id;
  std::memcpy(id.internal, bytes.data(), kUniqueIdBytes);
  return id;
}

absl::StatusOr<ncclUniqueId> BroadcastUniqueId(Group& group, NcclApi& nccl,
                                               absl::Duration timeout) {
  // Byte 0: 1 when rank 0 made an id, then the id.
  std::vector<uint8_t> buf(1 + kUniqueIdBytes, 0);
  absl::Status made;
  if (group.rank() == 0) {
    absl::StatusOr<std::string> id = NewUniqueIdBytes(nccl);
    made = id.status();
    if (id.ok()) {
      buf[0] = 1;
      std::memcpy(buf.data() + 1, id->data(), kUniqueIdBytes);
    }
  }
  CollectiveOptions opts;
  opts.timeout = timeout;
  opts.label = "NCCL unique id";
  ASSIGN_OR_RETURN(WorkPtr w, group.Broadcast(buf.data(), buf.size(), DType::kU8, 0, opts));
  RETURN_IF_ERROR(w->Wait(timeout));
  if (!made.ok()) return made;
  if (buf[0] != 1) {
    return absl::UnavailableError(absl::StrCat(
        "rank 0 of group '", group.name(), "' could not create the NCCL unique id (see its log)"));
  }
  return UniqueIdFromBytes(absl::string_view(reinterpret_cast<const char*>(buf.data() + 1),
                                             kUniqueIdBytes));
}

}  // namespace braid::nccl
