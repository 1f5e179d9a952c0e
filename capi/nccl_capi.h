// The C API's nccl half: checking braid_world_options_t's nccl fields, worlds from a caller's
// unique id, and braid_nccl_unique_id. The nccl backend is linked in, but NCCL itself is opened
// with dlopen only when one of these needs it (backends/nccl/nccl_library.h), so libbraid.so
// loads on machines without NCCL or a GPU.
#ifndef BRAID_CAPI_NCCL_CAPI_H_
#define BRAID_CAPI_NCCL_CAPI_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "capi/braid.h"
#include "comm/backend.h"
#include "comm/options.h"

namespace braid::capi {

// Applies cuda_device / nccl_blocking to `options` and checks the unique-id fields against
// the resolved backend. InvalidArgument naming the field.
absl::Status ApplyNcclFields(const braid_world_options_t& o, Options& options);

// True when the world comes from the caller's unique id (backend "nccl", unique_id set).
bool FromUniqueId(const braid_world_options_t& o);

// NcclBackend::CreateFromUniqueId on the real libraries (NCCL from options.nccl_library).
absl::StatusOr<std::unique_ptr<Backend>> CreateNcclFromUniqueId(const braid_world_options_t& o,
                                                                const Options& options);

}  // namespace braid::capi

#endif  // BRAID_CAPI_NCCL_CAPI_H_
