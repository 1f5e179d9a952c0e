// libbraid_test_faulty_plugin.so: the local plugin with faults, one per way a plugin can fail
// after loading, so tests can see each come back as the right error status:
//   all_gather      the launch itself fails (INVALID_ARGUMENT): no Work, an error right away
//   barrier         completes with TIMEOUT through the callback, before the launch returns
//   all_reduce      world rank 1 fails at the world group's collective #1 (fault injection
//                   of the wrapped local backend): an asynchronous error on every rank
//   broadcast, comm_split, capabilities   NULL: Braid reports Unimplemented naming them
#include <cstdint>
#include <cstdio>

#include "backends/plugin/braid_backend_v1.h"
#include "tests/plugins/local_plugin.h"

namespace tp = braid::test_plugin;

namespace {

int FaultyInit(braid_backend_log_fn_v1 log, void* log_arg, int world_size, int64_t timeout_ms,
               void** ctx, braid_backend_error_v1* error) {
  const int rc = tp::Init(log, log_arg, world_size, timeout_ms, ctx, error);
  if (rc == BRAID_BACKEND_OK && world_size > 1) tp::FailWorldRankAt(*ctx, 1, 1);
  return rc;
}

int RefusingAllGather(void* comm, const void* send, void* recv, size_t sendcount, int dtype,
                      braid_backend_done_fn_v1 done, void* done_arg,
                      braid_backend_error_v1* error) {
  std::snprintf(error->message, sizeof(error->message),
                "faulty test plugin refuses all_gather of %zu elements", sendcount);
  return BRAID_BACKEND_INVALID_ARGUMENT;
}

int TimingOutBarrier(void* comm, braid_backend_done_fn_v1 done, void* done_arg,
                     braid_backend_error_v1* error) {
  done(done_arg, BRAID_BACKEND_TIMEOUT, "faulty test plugin: barrier timed out at once");
  return BRAID_BACKEND_OK;
}

}  // namespace

extern "C" {

extern const braid_backend_v1 braidBackendPlugin_v1;
const braid_backend_v1 braidBackendPlugin_v1 = {
    .abi_version = BRAID_BACKEND_ABI_VERSION,
    .struct_size = sizeof(braid_backend_v1),
    .name = "braid_test_faulty",
    .init = FaultyInit,
    .finalize = tp::Finalize,
    .world_size = tp::WorldSize,
    .local_ranks = tp::LocalRanks,
    .comm_create_world = tp::CommCreateWorld,
    .comm_info = tp::CommInfo,
    .comm_split = nullptr,
    .comm_destroy = tp::CommDestroy,
    .capabilities = nullptr,
    .all_reduce = tp::AllReduce,
    .reduce_scatter = tp::ReduceScatter,
    .all_gather = RefusingAllGather,
    .broadcast = nullptr,
    .barrier = TimingOutBarrier,
};

}  // extern "C"
