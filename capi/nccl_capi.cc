// C API: the nccl backend's world options and unique ids.
#include "capi/nccl_capi.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/nccl/unique_id.h"
#include "capi/errors.h"
#include "comm/status_macros.h"

namespace braid::capi {

absl::Status ApplyNcclFields(const braid_world_options_t& o, Options& options) {
  if (o.cuda_device < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda_device must be >= -1 (-1: BRAID_CUDA_DEVICE or rank modulo devices), got ",
        o.cuda_device));
  }
  if (o.nccl_blocking < -1 || o.nccl_blocking > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl_blocking must be -1 (default), 0 or 1, got ", o.nccl_blocking));
  }
  if (o.cuda_device >= 0) options.cuda_device = o.cuda_device;
  if (o.nccl_blocking >= 0) options.nccl_blocking = o.nccl_blocking == 1;
  if (o.unique_id == nullptr) {
    if (o.unique_id_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unique_id_size is ", o.unique_id_size, " but unique_id is NULL"));
    }
    if (o.world_size == 0 && o.rank != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank (", o.rank,
                       ") goes with a unique_id or an explicit rendezvous (world_size), "
                       "which are both unset: leave it 0"));
    }
    return absl::OkStatus();  // world_size without unique_id: rendezvous_capi checks it
  }
  if (options.backend != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat("unique_id is set but the backend is '",
                                                   options.backend,
                                                   "': a unique id is for backend \"nccl\" only"));
  }
  if (o.unique_id_size != nccl::kUniqueIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("unique_id_size is ", o.unique_id_size, ": an NCCL unique id has ",
                     nccl::kUniqueIdBytes, " bytes (the size braid_nccl_unique_id reports)"));
  }
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be >= 1 with a unique_id, got ", o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is outside [0, ", o.world_size, ") (world_size)"));
  }
  return absl::OkStatus();
}

bool FromUniqueId(const braid_world_options_t& o) { return o.unique_id != nullptr; }

absl::StatusOr<std::unique_ptr<Backend>> CreateNcclFromUniqueId(const braid_world_options_t& o,
                                                                const Options& options) {
  const std::string id(static_cast<const char*>(o.unique_id), o.unique_id_size);
  ASSIGN_OR_RETURN(
      std::unique_ptr<nccl::NcclBackend> b,
      nccl::NcclBackend::CreateFromUniqueId(nccl::RealApis(options.nccl_library), id, o.world_size,
                                            o.rank, nccl::NcclConfigFromOptions(options)));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace braid::capi

using braid::capi::CheckNotNull;
using braid::capi::Guard;

extern "C" {

braid_status_t braid_nccl_unique_id(void* out, size_t capacity, size_t* size) {
  return Guard("braid_nccl_unique_id", [&]() -> absl::Status {
    RETURN_IF_ERROR(CheckNotNull(size, "size"));
    *size = braid::nccl::kUniqueIdBytes;
    if (out == nullptr) return absl::OkStatus();
    if (capacity < braid::nccl::kUniqueIdBytes) {
      return absl::OutOfRangeError(absl::StrCat("an NCCL unique id has ",
                                                braid::nccl::kUniqueIdBytes,
                                                " bytes but 'out' has room for ", capacity));
    }
    ASSIGN_OR_RETURN(const braid::Options options, braid::Options::FromEnv());
    ASSIGN_OR_RETURN(const std::string id, braid::nccl::NewUniqueIdBytes(
                                               *braid::nccl::RealNcclApi(options.nccl_library)));
    std::memcpy(out, id.data(), id.size());
    return absl::OkStatus();
  });
}

}  // extern "C"
