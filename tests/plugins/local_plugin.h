// The entries of a test backend plugin that wraps Braid's own `local` backend behind the C ABI
// of backends/plugin/braid_backend_v1.h: a real multi-rank (threads of this process),
// asynchronous, splittable backend, so tests can run every collective through the plugin
// path and compare bit for bit with the serial reference.
//
// It is also a worked example of a C++ plugin: opaque handles are heap objects owned through
// the ABI's create/destroy pairs, every entry catches its own exceptions, and absl statuses
// become ABI codes at the boundary (ReportAbiError). Tables are assembled from these entries
// in local_plugin_table.cc (the working plugin) and faulty_plugin_table.cc (fault injection).
#ifndef BRAID_TESTS_PLUGINS_LOCAL_PLUGIN_H_
#define BRAID_TESTS_PLUGINS_LOCAL_PLUGIN_H_

#include <cstddef>
#include <cstdint>

#include "backends/plugin/braid_backend_v1.h"

namespace braid::test_plugin {

// Writes a line through the host log callback of the context `ctx` (from Init).
void HostLog(void* ctx, int level, const char* message);
// Makes world rank `world_rank` fail at collective `seq` of the world group (fault injection
// of the wrapped local backend).
void FailWorldRankAt(void* ctx, int world_rank, uint64_t seq);

int Init(braid_backend_log_fn_v1 log, void* log_arg, int world_size, int64_t timeout_ms, void** ctx,
         braid_backend_error_v1* error);
int Finalize(void* ctx, braid_backend_error_v1* error);
int WorldSize(void* ctx, int* world_size, braid_backend_error_v1* error);
int LocalRanks(void* ctx, int* ranks, int capacity, int* count, braid_backend_error_v1* error);
int CommCreateWorld(void* ctx, int rank, void** comm, braid_backend_error_v1* error);
int CommInfo(void* comm, int* rank, int* size, braid_backend_error_v1* error);
int CommSplit(void* comm, int color, int key, void** child, braid_backend_error_v1* error);
int CommDestroy(void* comm, braid_backend_error_v1* error);
uint64_t Capabilities(void* ctx);
int AllReduce(void* comm, const void* send, void* recv, size_t count, int dtype, int op,
              double scalar, braid_backend_done_fn_v1 done, void* done_arg,
              braid_backend_error_v1* error);
int ReduceScatter(void* comm, const void* send, void* recv, size_t recvcount, int dtype, int op,
                  double scalar, braid_backend_done_fn_v1 done, void* done_arg,
                  braid_backend_error_v1* error);
int AllGather(void* comm, const void* send, void* recv, size_t sendcount, int dtype,
              braid_backend_done_fn_v1 done, void* done_arg, braid_backend_error_v1* error);
int Broadcast(void* comm, const void* send, void* recv, size_t count, int dtype, int root,
              braid_backend_done_fn_v1 done, void* done_arg, braid_backend_error_v1* error);
int Barrier(void* comm, braid_backend_done_fn_v1 done, void* done_arg,
            braid_backend_error_v1* error);

}  // namespace braid::test_plugin

#endif  // BRAID_TESTS_PLUGINS_LOCAL_PLUGIN_H_
