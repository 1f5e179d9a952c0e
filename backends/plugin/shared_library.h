// SharedLibrary: a dlopen handle owned by an object (dlclose in the destructor).
//
//   ASSIGN_OR_RETURN(SharedLibrary lib, SharedLibrary::Open("/opt/acme/libacme.so"));
//   const void* sym = lib.Symbol("braidBackendPlugin_v1");   // nullptr if not exported
//
// Opened with RTLD_NOW | RTLD_LOCAL: a library with unresolved symbols fails here, with the
// loader's own text, instead of at the first call; its symbols never satisfy other libraries.
// Whatever the library handed out (function pointers, threads) must be gone before the
// object is destroyed.
#ifndef BRAID_BACKENDS_PLUGIN_SHARED_LIBRARY_H_
#define BRAID_BACKENDS_PLUGIN_SHARED_LIBRARY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace braid::plugin {

class SharedLibrary {
 public:
  // NotFound (path + dlerror text) when no file is at `path`; FailedPrecondition (path +
  // dlerror text) when a file is there but cannot be loaded (not a library, wrong
  // architecture, missing dependency). A path without '/' is searched as dlopen does.
  static absl::StatusOr<SharedLibrary> Open(absl::string_view path);

  SharedLibrary(SharedLibrary&& other) noexcept;
  SharedLibrary& operator=(SharedLibrary&& other) noexcept;
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;
  ~SharedLibrary();

  // Address of the exported symbol `name`, or nullptr when the library does not export it.
  const void* Symbol(const char* name) const;
  const std::string& path() const { return path_; }

 private:
  SharedLibrary(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}

  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace braid::plugin

#endif  // BRAID_BACKENDS_PLUGIN_SHARED_LIBRARY_H_
