// The host side of backend modules (backends/module/backend_module.h): a backend registered by
// name whose code is loaded from libbraid-<backend>.so the first time a world asks for it.
//
//   // backends/mpi/mpi_lazy.cc, linked into libbraid.so (no Open MPI dependency)
//   const ModuleRegistration kMpi(ModuleSpec{
//       "mpi", "Open MPI: one process per rank (loaded from libbraid-mpi.so on first use)",
//       "libbraid-mpi.so", "libmpi.so.40", "Open MPI 4", "libopenmpi3"});
//
//   BackendRegistry::Global().Create("mpi", options);   // loads libbraid-mpi.so, then creates
//
// Where modules are looked for: options.backend_module_dir (BRAID_BACKEND_MODULE_DIR) when set,
// else the directory of the shared object this code is linked into (libbraid.so; symlinks
// resolved), found with dladdr. So an installed layout only has to keep the modules beside
// libbraid.so (the wheel's braid/ folder, an SDK's lib/).
//
// Errors (FailedPrecondition) name the backend, the module's path, the system library and the
// Debian package that provides it, whichever step failed:
//   - no module file at the path ("... its module libbraid-mpi.so is not in /x ...");
//   - dlopen failed, usually the system library missing (dlerror's text names it);
//   - the file is not a module of this build (no braidBackendModule_v1, another ABI version,
//     another interface stamp, another backend's name).
// A failed load is retried by the next Create (the environment may have changed); a loaded
// module stays loaded for the process's life (contract 3) and is reused.
//
// A backend linked into the binary (its static BackendRegistration) takes precedence over the
// module of the same name (comm/backend.h), so C++ tests that link //backends/mpi are unchanged.
#ifndef BRAID_BACKENDS_MODULE_MODULE_LOADER_H_
#define BRAID_BACKENDS_MODULE_MODULE_LOADER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "backends/module/backend_module.h"
#include "comm/options.h"

namespace braid::module {

struct ModuleSpec {
  std::string backend;         // registry name: "mpi"
  std::string description;     // for BackendRegistry listings
  std::string file;            // the module's file name: "libbraid-mpi.so"
  std::string system_library;  // what the module links that a machine may lack: "libmpi.so.40"
  std::string provider;        // who ships system_library: "Open MPI 4"
  std::string debian_package;  // the Debian/Ubuntu package to install: "libopenmpi3"
};

// The directory modules are loaded from (see the header comment). Internal when dladdr cannot
// name the object this code lives in.
absl::StatusOr<std::string> ModuleDirectory(const Options& options);

// Loads `spec`'s module from `dir` (dlopen, then the checks above) and returns its
// description; `dir_origin` says in messages where `dir` came from. A module already loaded
// from that path is returned again without reloading.
absl::StatusOr<const BackendModuleV1*> LoadModule(const ModuleSpec& spec, const std::string& dir,
                                                  absl::string_view dir_origin = "");

// Registers spec.backend in BackendRegistry::Global() as a module (at static-initialization
// time, like BackendRegistration). Its factory loads the module, then calls its `create`.
struct ModuleRegistration {
  explicit ModuleRegistration(ModuleSpec spec);
};

}  // namespace braid::module

#endif  // BRAID_BACKENDS_MODULE_MODULE_LOADER_H_
