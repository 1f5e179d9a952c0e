// Registers "gloo" as a backend module (backends/module/module_loader.h): libbraid.so links
// this instead of the backend, so it loads without Gloo; the first world on "gloo" (named, or
// picked for a torchrun / srun launch without a GPU by braid.h's launcher rule) loads
// libbraid-gloo.so from beside it.
#include "backends/module/module_loader.h"

namespace braid::gloo_backend {
namespace {
const module::ModuleRegistration kGlooModule(module::ModuleSpec{
    /*backend=*/"gloo",
    /*description=*/
    "Gloo over TCP on CPU buffers, one rank per process (module "
    "libbraid-gloo.so, loaded on first use)",
    /*file=*/"libbraid-gloo.so",
    /*system_library=*/"libgloo.so.0",
    /*provider=*/"Gloo",
    /*debian_package=*/"libgloo0"});
}  // namespace
}  // namespace braid::gloo_backend
