// The entry point of libbraid-mpi.so, the mpi backend as a module (backends/module/
// backend_module.h). Linked only into that module: it exports braidBackendModule_v1.
#include "backends/module/backend_module.h"
#include "backends/mpi/mpi_backend.h"
#include "comm/logging.h"

namespace braid::mpi {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateInModule(const Options& options) {
  SetLogLevel(options.log_level);  // the module's own logger (contract 2)
  return MpiBackend::Create(options);
}

}  // namespace
}  // namespace braid::mpi

BRAID_MODULE_EXPORT const braid::module::BackendModuleV1* braidBackendModule_v1() {
  static constexpr braid::module::BackendModuleV1 kModule =
      braid::module::MakeBackendModuleV1("mpi", &braid::mpi::CreateInModule);
  return &kModule;
}
