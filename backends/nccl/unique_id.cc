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
  return UniqueIdFromBytes(
      absl::string_view(reinterpret_cast<const char*>(buf.data() + 1), kUniqueIdBytes));
}

absl::StatusOr<ncclUniqueId> ExchangeUniqueId(rendezvous::TcpStore& store, absl::string_view prefix,
                                              int rank, int world_size, NcclApi& nccl) {
  // Byte 0: 1 and the id, or 0 and rank 0's error message.
  const std::string key = absl::StrCat(prefix, "/unique_id");
  const auto read_key = [&](int r) { return absl::StrCat(prefix, "/unique_id_read/", r); };
  if (rank == 0) {
    absl::StatusOr<std::string> id = NewUniqueIdBytes(nccl);
    std::string value(1, id.ok() ? '\1' : '\0');
    value += id.ok() ? *id : id.status().ToString();
    RETURN_IF_ERROR(store.Set(key, value));
    // Rank 0 serves the store: it stays until every rank has read the value (above all its
    // failure, which it would otherwise take down with the server), within the deadline.
    std::vector<std::string> readers;
    for (int r = 1; r < world_size; ++r) readers.push_back(read_key(r));
    const absl::Status read = store.Wait(readers);
    if (!id.ok()) return id.status();
    RETURN_IF_ERROR(read);
    return UniqueIdFromBytes(*id);
  }
  ASSIGN_OR_RETURN(const std::string value, store.Get(key));
  RETURN_IF_ERROR(store.Set(read_key(rank), ""));
  if (value.empty() || value[0] != 1) {
    return absl::UnavailableError(
        absl::StrCat("rank 0 could not create the NCCL unique id (store key '", key, "' at ",
                     store.address(), "): ", value.empty() ? "" : value.substr(1)));
  }
  return UniqueIdFromBytes(absl::string_view(value).substr(1));
}

}  // namespace braid::nccl
