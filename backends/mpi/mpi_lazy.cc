// Registers "mpi" as a backend module (backends/module/module_loader.h): libbraid.so links
// this instead of the backend, so it loads without Open MPI; the first world on "mpi" (named,
// or picked under mpirun by braid.h's launcher rule) loads libbraid-mpi.so from beside it.
#include "backends/module/module_loader.h"

namespace braid::mpi {
namespace {
const module::ModuleRegistration kMpiModule(module::ModuleSpec{
    /*backend=*/"mpi",
    /*description=*/
    "OpenMPI: one process per rank, CPU buffers (module libbraid-mpi.so, "
    "loaded on first use)",
    /*file=*/"libbraid-mpi.so",
    /*system_library=*/"libmpi.so.40",
    /*provider=*/"Open MPI 4",
    /*debian_package=*/"libopenmpi3"});
}  // namespace
}  // namespace braid::mpi
