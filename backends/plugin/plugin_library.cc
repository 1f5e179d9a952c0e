#include "backends/plugin/plugin_library.h"

#include <cstddef>
#include <utility>

#include "absl/strings/str_cat.h"
#include "comm/status_macros.h"

namespace braid::plugin {
namespace {

// A released table never changes (new entries go into the next version): catch an edit of
// braid_backend_v1.h that would move a field of plugins already built (LP64 layout).
static_assert(sizeof(void*) != 8 ||
                  (sizeof(braid_backend_v1) == 128 && offsetof(braid_backend_v1, name) == 8 &&
                   offsetof(braid_backend_v1, init) == 16 &&
                   offsetof(braid_backend_v1, barrier) == 120),
              "braid_backend_v1 is frozen: add new entries to a braid_backend_v2");

// Table versions this Braid can load, newest first. A v2 would be listed first, with an
// adapter presenting a v1 table as the newest one.
struct KnownVersion {
  int version;
  const char* symbol;
};
constexpr KnownVersion kKnownVersions[] = {
    {1, BRAID_BACKEND_PLUGIN_SYMBOL_V1},
};

// Highest version number probed when no known symbol is found, to tell "built for another
// Braid" apart from "not a Braid plugin".
constexpr int kMaxProbedVersion = 64;

bool IsKnownVersion(int v) {
  for (const KnownVersion& k : kKnownVersions) {
    if (k.version == v) return true;
  }
  return false;
}

// The error for a library that exports none of the known symbols.
absl::Status NoKnownSymbol(const SharedLibrary& lib) {
  for (int v = kMaxProbedVersion; v >= 0; --v) {
    if (IsKnownVersion(v)) continue;
    const std::string symbol = absl::StrCat(BRAID_BACKEND_PLUGIN_SYMBOL_PREFIX, v);
    if (lib.Symbol(symbol.c_str()) != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "plugin '", lib.path(), "' exports ", symbol, " (ABI version ", v,
          ") but not " BRAID_BACKEND_PLUGIN_SYMBOL_V1 ": this Braid supports ABI version ",
          BRAID_BACKEND_ABI_VERSION,
          "; rebuild the plugin against this Braid's "
          "braid_backend_v1.h"));
    }
  }
  return absl::NotFoundError(absl::StrCat("'", lib.path(),
                                          "' is not a Braid backend plugin: it exports no ",
                                          BRAID_BACKEND_PLUGIN_SYMBOL_V1, " symbol"));
}

}  // namespace

absl::Status ValidateTableV1(absl::string_view path, const braid_backend_v1& t) {
  if (t.abi_version != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plugin '", path, "' has ABI version ", t.abi_version, " in its ",
        BRAID_BACKEND_PLUGIN_SYMBOL_V1, " table, this Braid supports ", BRAID_BACKEND_ABI_VERSION));
  }
  if (t.struct_size < sizeof(braid_backend_v1)) {
    return absl::FailedPreconditionError(
        absl::StrCat("plugin '", path, "' declares struct_size ", t.struct_size,
                     ", smaller than braid_backend_v1 (", sizeof(braid_backend_v1),
                     " bytes): it was built against a different braid_backend_v1.h"));
  }
  if (t.name == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("plugin '", path, "' has a NULL name in its table"));
  }
  struct Required {
    const char* entry;
    bool present;
  };
  const Required required[] = {
      {"init", t.init != nullptr},
      {"finalize", t.finalize != nullptr},
      {"world_size", t.world_size != nullptr},
      {"local_ranks", t.local_ranks != nullptr},
      {"comm_create_world", t.comm_create_world != nullptr},
      {"comm_info", t.comm_info != nullptr},
      {"comm_destroy", t.comm_destroy != nullptr},
  };
  for (const Required& r : required) {
    if (!r.present) {
      return absl::FailedPreconditionError(absl::StrCat(
          "plugin '", path, "' (", t.name, ") leaves the required entry ", r.entry, " NULL"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const PluginLibrary>> PluginLibrary::Load(absl::string_view path) {
  ASSIGN_OR_RETURN(SharedLibrary lib, SharedLibrary::Open(path));
  for (const KnownVersion& k : kKnownVersions) {
    const void* symbol = lib.Symbol(k.symbol);
    if (symbol == nullptr) continue;
    // Only v1 exists; a newer version would be checked by its own ValidateTable and adapted.
    const auto* table = static_cast<const braid_backend_v1*>(symbol);
    RETURN_IF_ERROR(ValidateTableV1(lib.path(), *table));
    return std::shared_ptr<const PluginLibrary>(new PluginLibrary(std::move(lib), table));
  }
  return NoKnownSymbol(lib);
}

PluginLibrary::PluginLibrary(SharedLibrary lib, const braid_backend_v1* table)
    : lib_(std::move(lib)), table_(table), name_(table->name) {}

}  // namespace braid::plugin
