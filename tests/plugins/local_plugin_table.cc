// libbraid_test_plugin.so: the local backend behind the C ABI, every entry present.
#include "backends/plugin/braid_backend_v1.h"
#include "tests/plugins/local_plugin.h"

namespace tp = braid::test_plugin;

extern "C" {

// The one exported symbol (see export_v1.lds). Fields in declaration order.
extern const braid_backend_v1 braidBackendPlugin_v1;
const braid_backend_v1 braidBackendPlugin_v1 = {
    .abi_version = BRAID_BACKEND_ABI_VERSION,
    .struct_size = sizeof(braid_backend_v1),
    .name = "braid_test_local",
    .init = tp::Init,
    .finalize = tp::Finalize,
    .world_size = tp::WorldSize,
    .local_ranks = tp::LocalRanks,
    .comm_create_world = tp::CommCreateWorld,
    .comm_info = tp::CommInfo,
    .comm_split = tp::CommSplit,
    .comm_destroy = tp::CommDestroy,
    .capabilities = tp::Capabilities,
    .all_reduce = tp::AllReduce,
    .reduce_scatter = tp::ReduceScatter,
    .all_gather = tp::AllGather,
    .broadcast = tp::Broadcast,
    .barrier = tp::Barrier,
};

}  // extern "C"
