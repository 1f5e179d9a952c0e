// The entry point of libbraid-gloo.so, the gloo backend as a module (backends/module/
// backend_module.h). Linked only into that module: it exports braidBackendModule_v1.
#include "backends/gloo/gloo_backend.h"
#include "backends/module/backend_module.h"
#include "comm/logging.h"

BRAID_DEFINE_BACKEND_MODULE("gloo", braid::gloo_backend::GlooBackend)
