// PluginLibrary: a backend plugin's shared library, loaded and its function table checked.
//
//   ASSIGN_OR_RETURN(std::shared_ptr<const PluginLibrary> lib, PluginLibrary::Load(path));
//   const braid_backend_v1& t = lib->table();   // abi_version, struct_size, name and every
//                                               // required entry checked; optional may be NULL
//
// Loading follows NCCL's plugin loader: look for the newest table symbol this Braid knows
// first (today only braidBackendPlugin_v1), so a library may export several versions and the
// newest wins. Every failure is an error naming the file and the problem:
//   NotFound            no file at the path; or no braidBackendPlugin_v<N> symbol at all
//   FailedPrecondition  the file cannot be loaded (dlopen's text); it exports only versions
//                       this Braid does not know ("exports braidBackendPlugin_v2, this Braid
//                       supports 1"); abi_version is not the symbol's version ("has ABI
//                       version 99, this Braid supports 1"); struct_size too small; name or
//                       a required entry NULL.
// The library stays loaded as long as the PluginLibrary lives: keep it (shared_ptr) alive
// while any function pointer or object of the plugin is in use.
#ifndef BRAID_BACKENDS_PLUGIN_PLUGIN_LIBRARY_H_
#define BRAID_BACKENDS_PLUGIN_PLUGIN_LIBRARY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "backends/plugin/braid_backend_v1.h"
#include "backends/plugin/shared_library.h"

namespace braid::plugin {

class PluginLibrary {
 public:
  static absl::StatusOr<std::shared_ptr<const PluginLibrary>> Load(absl::string_view path);

  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  const braid_backend_v1& table() const { return *table_; }
  const std::string& path() const { return lib_.path(); }
  // The table's name, e.g. "acme": what every message about the plugin calls it.
  const std::string& name() const { return name_; }

 private:
  PluginLibrary(SharedLibrary lib, const braid_backend_v1* table);

  SharedLibrary lib_;
  const braid_backend_v1* table_;
  std::string name_;
};

// Checks a v1 table found in the library at `path` (exposed for tests): the header fields
// first, reading nothing past `struct_size`, then `name` and the required entries.
absl::Status ValidateTableV1(absl::string_view path, const braid_backend_v1& table);

}  // namespace braid::plugin

#endif  // BRAID_BACKENDS_PLUGIN_PLUGIN_LIBRARY_H_
