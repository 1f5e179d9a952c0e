// Registers the gloo backend linked into this binary as "gloo" (//backends/gloo). Binaries that
// load it as a module instead link //backends/gloo:lazy (backends/module/module_loader.h).
#include "backends/gloo/gloo_backend.h"
#include "comm/backend.h"

namespace braid::gloo_backend {
namespace {
const BackendRegistration kRegistration(
    "gloo",
    "Gloo over TCP on CPU buffers: one rank per process, for torchrun / srun worlds or beside "
    "torch.distributed (a TCP rendezvous store on MASTER_ADDR); one rank without a launcher",
    &GlooBackend::Create);
}  // namespace
}  // namespace braid::gloo_backend
