// Backend modules: a Braid backend built as a shared library of its own
// (libbraid-<backend>.so, shipped beside libbraid.so) and loaded the first time a world needs
// it, so that libbraid.so itself loads on machines without that backend's system library
// (Open MPI for `mpi`, Gloo for `gloo`). This header is the contract between the host
// (libbraid.so, backends/module/module_loader.h) and a module; both sides include it.
//
//   // backends/mpi/mpi_module.cc, linked only into libbraid-mpi.so:
//   BRAID_DEFINE_BACKEND_MODULE("mpi", braid::mpi::MpiBackend)
//
// A module exports one symbol, braidBackendModule_v1, and hands the host comm/'s C++ objects
// (unlike the C plugin ABI of backends/plugin/braid_backend_v1.h), so:
//   1. Same build: the host refuses a module whose interface_stamp (a hash of comm/'s headers,
//      this header and the compiler's version) differs from its own, naming both.
//   2. Self-contained: a module links its own copy of comm/ and exports only its entry symbol;
//      nothing may rely on an object's identity across the boundary (no dynamic_cast/typeid).
//   3. Never unloaded (RTLD_NODELETE): its objects may live until the process exits.
//   4. Errors: `create` returns a status; a missing system library fails the dlopen, named.
//   5. Versioning: an incompatible change is braidBackendModule_v2; v1's layout never changes.
// Why each rule: docs/design/backends.md, "Backend modules".
#ifndef BRAID_BACKENDS_MODULE_BACKEND_MODULE_H_
#define BRAID_BACKENDS_MODULE_BACKEND_MODULE_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "backends/module/interface_stamp.h"  // generated: BRAID_MODULE_HEADERS_HASH
#include "comm/backend.h"
#include "comm/options.h"

namespace braid::module {

inline constexpr int kBackendModuleAbiVersion = 1;
inline constexpr char kBackendModuleSymbolV1[] = "braidBackendModule_v1";
// What a module and its host must agree on (contract 1).
inline constexpr char kInterfaceStamp[] =
    "comm-headers:" BRAID_MODULE_HEADERS_HASH " compiler:" __VERSION__;

struct BackendModuleV1 {
  size_t struct_size;           // sizeof(BackendModuleV1) in the module's build
  int abi_version;              // kBackendModuleAbiVersion
  const char* interface_stamp;  // the module's kInterfaceStamp
  const char* name;             // the backend's registry name: "mpi", "gloo"
  // Creates the backend for a world, as a BackendFactory would (comm/backend.h).
  absl::StatusOr<std::unique_ptr<Backend>> (*create)(const Options& options);
};

// A filled-in V1 description for braidBackendModule_v1 to return.
constexpr BackendModuleV1 MakeBackendModuleV1(
    const char* name, absl::StatusOr<std::unique_ptr<Backend>> (*create)(const Options&)) {
  return BackendModuleV1{sizeof(BackendModuleV1), kBackendModuleAbiVersion, kInterfaceStamp, name,
                         create};
}

}  // namespace braid::module

// The exported entry point of a module (contract 2: the only symbol a module exports).
#define BRAID_MODULE_EXPORT extern "C" __attribute__((visibility("default")))

// A module's whole entry point for a backend class with a static
// `absl::StatusOr<std::unique_ptr<Backend>> Create(const Options&)`: `create` applies the
// options' log level to the module's own logger (contract 2), then creates the backend.
// Needs comm/logging.h. Used once per module, at namespace scope:
//   BRAID_DEFINE_BACKEND_MODULE("mpi", braid::mpi::MpiBackend)
#define BRAID_DEFINE_BACKEND_MODULE(name, BackendClass)                                 \
  BRAID_MODULE_EXPORT const ::braid::module::BackendModuleV1* braidBackendModule_v1() { \
    static constexpr ::braid::module::BackendModuleV1 kModule =                         \
        ::braid::module::MakeBackendModuleV1(                                           \
            name,                                                                       \
            [](const ::braid::Options& options)                                         \
                -> absl::StatusOr<std::unique_ptr<::braid::Backend>> {                  \
              ::braid::SetLogLevel(options.log_level);                                  \
              return BackendClass::Create(options);                                     \
            });                                                                         \
    return &kModule;                                                                    \
  }
using BraidBackendModuleV1Fn = const braid::module::BackendModuleV1* (*)();

#endif  // BRAID_BACKENDS_MODULE_BACKEND_MODULE_H_
