/* libbraid_test_abi99_plugin.so: exports braidBackendPlugin_v1 with abi_version 99, as a
 * plugin built against some other Braid's header would. Braid must refuse it, naming both
 * versions, before touching any entry. Also proves braid_backend_v1.h compiles as C99. */
#include "backends/plugin/braid_backend_v1.h"

const braid_backend_v1 braidBackendPlugin_v1 = {
    99,                       /* abi_version */
    sizeof(braid_backend_v1), /* struct_size */
    "braid_test_abi99",       /* name; every entry left NULL */
};
