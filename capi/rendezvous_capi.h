// The C API's explicit rendezvous (braid_world_options_t 0.10: world_size / rank without a
// unique id, master_addr, store_port, rendezvous_publish / rendezvous_lookup): checking the
// fields, turning the C callbacks into Options::rendezvous (comm/rendezvous_spec.h), and
// checking a world made by another backend against it.
//
//   RETURN_IF_ERROR(ApplyRendezvousFields(o, options));   // before the launcher rule
//   ... create the backend ...
//   RETURN_IF_ERROR(CheckWorldMatchesRendezvous(options, *backend));
#ifndef BRAID_CAPI_RENDEZVOUS_CAPI_H_
#define BRAID_CAPI_RENDEZVOUS_CAPI_H_

#include "absl/status/status.h"
#include "capi/braid.h"
#include "comm/backend.h"
#include "comm/options.h"

namespace braid::capi {

// Whether the fields ask for an explicit rendezvous (world_size set without a unique id).
bool ExplicitRendezvous(const braid_world_options_t& o);

// store_port into options.store_port (-1: keep the environment's); with an explicit rendezvous,
// options.rendezvous from the fields, the callbacks wrapped (the wrappers call them with
// rendezvous_data, hold nothing else, and are only called inside braid_world_create).
// InvalidArgument naming the field: master_addr / rendezvous_* without world_size, one callback
// without the other, store_port outside -1..65535, rank outside [0, world_size).
absl::Status ApplyRendezvousFields(const braid_world_options_t& o, Options& options);

// With options.rendezvous set: the backend's world has its world_size ranks and this process
// hosts exactly its rank (a backend that ignores the rendezvous, e.g. BRAID_BACKEND=local or
// mpi, must describe the same world). FailedPrecondition naming both worlds.
absl::Status CheckWorldMatchesRendezvous(const Options& options, const Backend& backend);

}  // namespace braid::capi

#endif  // BRAID_CAPI_RENDEZVOUS_CAPI_H_
