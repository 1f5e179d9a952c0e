// Backend modules: a Braid backend built as a shared library of its own
// (libbraid-<backend>.so, shipped beside libbraid.so) and loaded the first time a world needs
// it, so that libbraid.so itself loads on machines without the system library that backend
// needs (Open MPI for `mpi`, Gloo for `gloo`). This header is the contract between the host
// (libbraid.so, backends/module/module_loader.h) and a module; both sides include it.
//
// A module exports one symbol, braidBackendModule_v1, returning its description:
//
//   // backends/mpi/mpi_module.cc, linked only into libbraid-mpi.so: the module's logger
//   // takes the options' level (see below), then MpiBackend::Create(options) runs.
//   BRAID_DEFINE_BACKEND_MODULE("mpi", braid::mpi::MpiBackend)
//
// Why a C++ boundary and not the C plugin ABI (backends/plugin/braid_backend_v1.h): a module is
// one of Braid's own backends, with what the plugin ABI cannot carry (device events, the mpi
// backend's abort channel and watchdog, group names, per-call deadlines). The objects that
// cross are comm/'s: `create` returns a Backend whose Groups and Works the host drives through
// their virtual functions; Options, Status and the comm/ value types pass by value or
// reference. That is sound only between a host and a module compiled from the same comm/
// headers with the same compiler, so:
//
// Contract:
//   1. Same build. `interface_stamp` is a hash of comm/'s headers and of this header plus the
//      compiler's version (kInterfaceStamp); the host refuses a module whose stamp differs
//      from its own, naming both. Modules are not a third-party interface: ship them with the
//      libbraid.so they were built with (the wheel and an SDK install keep them side by side).
//   2. Self-contained. A module links its own copy of the comm/ code it uses and exports only
//      braidBackendModule_v1 (backends/module/module.lds), so no symbol of one copy ever binds
//      to the other; Abseil, spdlog and fmt are the shared libraries the host also loads.
//      Consequences: the module has its own logger (`create` applies options.log_level), and
//      nothing may rely on the identity of an object across the boundary (no dynamic_cast or
//      typeid on a module's objects, no comparing a function-local static's address).
//   3. Lifetime. The host dlopens a module with RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE and never
//      unloads it: Backends, Groups and Works it created may live until the process exits.
//   4. Errors. `create` returns a status; nothing is thrown across (as everywhere in Braid).
//      Checking the module's system library is the dynamic loader's job: a module links it
//      (NEEDED), so a missing library fails the host's dlopen, which names it.
//   5. Versioning. A new incompatible struct or symbol is braidBackendModule_v2 with a new
//      kBackendModuleAbiVersion; V1's layout never changes (struct_size is checked first).
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
