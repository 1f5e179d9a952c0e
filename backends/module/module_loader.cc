#include "backends/module/module_loader.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "comm/logging.h"
#include "comm/status_macros.h"

namespace braid::module {
namespace {

// dlerror()'s text, or a placeholder when it has none (reading it clears it).
std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("no dlerror() message");
}

// "libmpi.so.40 (Open MPI 4; Debian/Ubuntu: apt install libopenmpi3)": every error names the
// system library and its package, so a user always learns what to install.
std::string SystemLibrary(const ModuleSpec& spec) {
  return absl::StrCat(spec.system_library, " (", spec.provider, "; Debian/Ubuntu: apt install ",
                      spec.debian_package, ")");
}

// Where the module directory came from, for messages.
std::string DirOrigin(const Options& options) {
  return options.backend_module_dir.empty()
             ? std::string("the directory of libbraid.so; BRAID_BACKEND_MODULE_DIR selects another")
             : std::string("BRAID_BACKEND_MODULE_DIR");
}

absl::StatusOr<const BackendModuleV1*> CheckModule(const ModuleSpec& spec, const std::string& path,
                                                   void* handle) {
  auto not_ours = [&](const std::string& why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend '", spec.backend, "': ", path, " is not a backend module of this libbraid.so: ",
        why, " (use the modules shipped with this libbraid.so)"));
  };
  dlerror();
  void* sym = dlsym(handle, kBackendModuleSymbolV1);
  if (sym == nullptr) return not_ours(absl::StrCat("it exports no ", kBackendModuleSymbolV1));
  const BackendModuleV1* m = reinterpret_cast<BraidBackendModuleV1Fn>(sym)();
  if (m == nullptr) return not_ours(absl::StrCat(kBackendModuleSymbolV1, "() returned NULL"));
  if (m->struct_size < sizeof(BackendModuleV1) || m->abi_version != kBackendModuleAbiVersion) {
    return not_ours(absl::StrCat("module ABI version ", m->abi_version, " (struct_size ",
                                 m->struct_size, "), this libbraid.so supports ",
                                 kBackendModuleAbiVersion, " (struct_size ",
                                 sizeof(BackendModuleV1), ")"));
  }
  if (m->interface_stamp == nullptr || std::strcmp(m->interface_stamp, kInterfaceStamp) != 0) {
    return not_ours(absl::StrCat("built from other Braid headers or another compiler (module '",
                                 m->interface_stamp != nullptr ? m->interface_stamp : "(null)",
                                 "', libbraid.so '", kInterfaceStamp, "')"));
  }
  if (m->name == nullptr || spec.backend != m->name || m->create == nullptr) {
    return not_ours(absl::StrCat("it is the module of backend '",
                                 m->name != nullptr ? m->name : "(null)", "'",
                                 m->create == nullptr ? " with no create function" : ""));
  }
  return m;
}

}  // namespace

absl::StatusOr<std::string> ModuleDirectory(const Options& options) {
  if (!options.backend_module_dir.empty()) return options.backend_module_dir;
  Dl_info info;
  if (dladdr(reinterpret_cast<const void*>(&ModuleDirectory), &info) == 0 ||
      info.dli_fname == nullptr || info.dli_fname[0] == '\0') {
    return absl::InternalError(
        "cannot tell which file libbraid.so was loaded from (dladdr failed): set "
        "BRAID_BACKEND_MODULE_DIR to the directory of the backend modules");
  }
  // Resolve symlinks: build systems and installers link libbraid.so from elsewhere, and the
  // modules sit beside the real file.
  std::string path = info.dli_fname;
  if (std::unique_ptr<char, decltype(&free)> real(realpath(info.dli_fname, nullptr), &free);
      real != nullptr) {
    path = real.get();
  }
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return std::string(".");
  return slash == 0 ? std::string("/") : path.substr(0, slash);
}

absl::StatusOr<const BackendModuleV1*> LoadModule(const ModuleSpec& spec, const std::string& dir,
                                                  absl::string_view dir_origin) {
  const std::string path =
      absl::StrCat(dir, dir.empty() || dir.back() == '/' ? "" : "/", spec.file);
  const std::string where =
      dir_origin.empty() ? std::string() : absl::StrCat(" (", dir_origin, ")");
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend '", spec.backend, "' is not available: its module ", spec.file, " is not in ", dir,
        where, ". It needs that module (installed beside libbraid.so) and ", SystemLibrary(spec)));
  }
  dlerror();
  // Contract 3: RTLD_NODELETE, never dlclose. dlopen of a path already loaded returns the
  // loaded image again (reference counted), so a second world reuses the module.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const std::string why = DlError();
    if (absl::StrContains(why, spec.system_library)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "backend '", spec.backend, "' is not available: it needs ", SystemLibrary(spec),
          ", which is not installed or not on the library path (loading ", path, ": ", why, ")"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("backend '", spec.backend, "' is not available: loading its module ", path,
                     where, " failed: ", why, ". The module needs ", SystemLibrary(spec)));
  }
  return CheckModule(spec, path, handle);
}

ModuleRegistration::ModuleRegistration(ModuleSpec spec) {
  auto shared = std::make_shared<const ModuleSpec>(std::move(spec));
  BackendFactory factory =
      [shared](const Options& options) -> absl::StatusOr<std::unique_ptr<Backend>> {
    ASSIGN_OR_RETURN(const std::string dir, ModuleDirectory(options));
    ASSIGN_OR_RETURN(const BackendModuleV1* m, LoadModule(*shared, dir, DirOrigin(options)));
    return m->create(options);
  };
  const absl::Status s = BackendRegistry::Global().RegisterModule(
      shared->backend, shared->description, std::move(factory));
  if (!s.ok()) Log().error("{}", s.ToString());
}

}  // namespace braid::module
