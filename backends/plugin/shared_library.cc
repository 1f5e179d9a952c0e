#include "backends/plugin/shared_library.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/logging.h"

namespace braid::plugin {

absl::StatusOr<SharedLibrary> SharedLibrary::Open(absl::string_view path) {
  std::string p(path);
  dlerror();  // clear any stale error of this thread
  void* handle = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    const std::string text = why != nullptr ? why : "unknown dlopen error";
    struct stat st;
    if (stat(p.c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) {
      return absl::NotFoundError(
          absl::StrCat("no shared library at '", p, "' (dlopen: ", text, ")"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load shared library '", p, "' (dlopen: ", text, ")"));
  }
  return SharedLibrary(handle, std::move(p));
}

SharedLibrary::SharedLibrary(SharedLibrary&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)), path_(std::move(other.path_)) {}

SharedLibrary& SharedLibrary::operator=(SharedLibrary&& other) noexcept {
  if (this != &other) {
    SharedLibrary dying(std::move(*this));
    handle_ = std::exchange(other.handle_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

SharedLibrary::~SharedLibrary() {
  if (handle_ == nullptr) return;
  if (dlclose(handle_) != 0) {
    const char* why = dlerror();
    Log().warn("dlclose('{}') failed: {}", path_, why != nullptr ? why : "unknown error");
  }
}

const void* SharedLibrary::Symbol(const char* name) const {
  dlerror();
  return dlsym(handle_, name);
}

}  // namespace braid::plugin
