// The entry point of libbraid-gloo.so, the gloo backend as a module (backends/module/
// backend_module.h). Linked only into that module: it exports braidBackendModule_v1.
#include "backends/gloo/gloo_backend.h"
#include "backends/module/backend_module.h"
#include "comm/logging.h"

namespace braid::gloo_backend {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateInModule(const Options& options) {
  SetLogLevel(options.log_level);  // the module's own logger (contract 2)
  return GlooBackend::Create(options);
}

}  // namespace
}  // namespace braid::gloo_backend

BRAID_MODULE_EXPORT const braid::module::BackendModuleV1* braidBackendModule_v1() {
  static constexpr braid::module::BackendModuleV1 kModule =
      braid::module::MakeBackendModuleV1("gloo", &braid::gloo_backend::CreateInModule);
  return &kModule;
}
