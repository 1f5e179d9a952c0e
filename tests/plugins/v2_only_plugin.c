/* libbraid_test_v2_only_plugin.so: exports braidBackendPlugin_v2 (a version this Braid does
 * not know) and no braidBackendPlugin_v1. Braid must say that it found v2, not just "no
 * symbol". The struct is a stand-in: only its header fields are meaningful. */
#include <stdint.h>

typedef struct {
  int32_t abi_version;
  uint32_t struct_size;
  const char* name;
} braid_test_future_table;

const braid_test_future_table braidBackendPlugin_v2 = {2, sizeof(braid_test_future_table),
                                                       "braid_test_v2_only"};
