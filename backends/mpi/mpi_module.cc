// The entry point of libbraid-mpi.so, the mpi backend as a module (backends/module/
// backend_module.h). Linked only into that module: it exports braidBackendModule_v1.
#include "backends/module/backend_module.h"
#include "backends/mpi/mpi_backend.h"
#include "comm/logging.h"

BRAID_DEFINE_BACKEND_MODULE("mpi", braid::mpi::MpiBackend)
