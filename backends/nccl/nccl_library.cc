#include "backends/nccl/nccl_library.h"

#include <dlfcn.h>

#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace braid::nccl {
namespace {

// dlerror()'s text, or a placeholder when it has none (it is cleared by reading it).
std::string DlError() {
  const char* e = dlerror();
  return e != nullptr ? std::string(e) : std::string("no dlerror() message");
}

// Every member of NcclFunctions with its symbol, in declaration order: Open and SymbolNames
// walk the same table.
template <typename Visit>
void ForEachSymbol(NcclFunctions& f, Visit&& visit) {
#define BRAID_NCCL_SYMBOL(name) visit("nccl" #name, f.name)
  BRAID_NCCL_SYMBOL(GetVersion);
  BRAID_NCCL_SYMBOL(GetUniqueId);
  BRAID_NCCL_SYMBOL(CommInitRankConfig);
  BRAID_NCCL_SYMBOL(CommInitAll);
  BRAID_NCCL_SYMBOL(CommSplit);
  BRAID_NCCL_SYMBOL(CommFinalize);
  BRAID_NCCL_SYMBOL(CommDestroy);
  BRAID_NCCL_SYMBOL(CommAbort);
  BRAID_NCCL_SYMBOL(CommGetAsyncError);
  BRAID_NCCL_SYMBOL(CommCount);
  BRAID_NCCL_SYMBOL(CommUserRank);
  BRAID_NCCL_SYMBOL(GetErrorString);
  BRAID_NCCL_SYMBOL(GetLastError);
  BRAID_NCCL_SYMBOL(GroupStart);
  BRAID_NCCL_SYMBOL(GroupEnd);
  BRAID_NCCL_SYMBOL(AllReduce);
  BRAID_NCCL_SYMBOL(ReduceScatter);
  BRAID_NCCL_SYMBOL(AllGather);
  BRAID_NCCL_SYMBOL(Broadcast);
  BRAID_NCCL_SYMBOL(RedOpCreatePreMulSum);
  BRAID_NCCL_SYMBOL(RedOpDestroy);
#undef BRAID_NCCL_SYMBOL
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclLibrary>> NcclLibrary::Open(const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError("NCCL library path is empty (BRAID_NCCL_LIBRARY)");
  }
  dlerror();  // clear a stale message
  // RTLD_NODELETE: dlclose drops the reference but never unmaps NCCL's code, since NCCL keeps
  // threads of its own running past the calls that started them (ncclGetUniqueId's bootstrap
  // root waits for the ranks of an id that may never be used).
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the NCCL library '", path, "': dlopen failed: ", DlError(),
                     " (install NCCL 2.28 or point BRAID_NCCL_LIBRARY at its libnccl.so.2)"));
  }
  std::unique_ptr<NcclLibrary> lib(new NcclLibrary(path, handle));
  std::string missing;
  ForEachSymbol(lib->fn_, [&](const char* symbol, auto& slot) {
    if (!missing.empty()) return;
    dlerror();
    void* p = dlsym(handle, symbol);
    if (p == nullptr) {
      missing = absl::StrCat("cannot load the NCCL library '", path, "': symbol '", symbol,
                             "' not found: ", DlError(), " (Braid needs NCCL 2.28 or newer)");
      return;
    }
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(p);
  });
  if (!missing.empty()) return absl::FailedPreconditionError(missing);
  const ncclResult_t rc = lib->fn_.GetVersion(&lib->version_);
  if (rc != ncclSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the NCCL library '", path, "': ncclGetVersion failed: ", lib->fn_.GetErrorString(rc)));
  }
  // The headers Braid is built with are 2.28's (ncclConfig_t, ncclCommSplit, ...); an older
  // library may accept the symbols and still misread them.
  if (lib->version_ < kMinNcclVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("the NCCL library '", path, "' is version ", lib->version_ / 10000, ".",
                     (lib->version_ / 100) % 100, ".", lib->version_ % 100,
                     "; Braid needs NCCL 2.28 or newer (point BRAID_NCCL_LIBRARY at one)"));
  }
  return lib;
}

NcclLibrary::~NcclLibrary() { dlclose(handle_); }

std::vector<std::string> NcclLibrary::SymbolNames() {
  std::vector<std::string> names;
  NcclFunctions unused;
  ForEachSymbol(unused, [&](const char* symbol, auto&) { names.push_back(symbol); });
  return names;
}

}  // namespace braid::nccl
