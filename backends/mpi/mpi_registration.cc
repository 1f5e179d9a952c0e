// Registers the mpi backend linked into this binary as "mpi" (//backends/mpi). Binaries that
// load it as a module instead link //backends/mpi:lazy (backends/module/module_loader.h).
#include "backends/mpi/mpi_backend.h"
#include "comm/backend.h"

namespace braid::mpi {
namespace {
const BackendRegistration kRegistration(
    "mpi",
    "OpenMPI: one process per rank, CPU buffers, blocking collectives on a thread per group "
    "(large calls) and nonblocking ones (small calls)",
    &MpiBackend::Create);
}  // namespace
}  // namespace braid::mpi
