// The NCCL loader (backends/nccl/nccl_library.h) on the real libnccl.so.2 of this machine, with
// no GPU needed: it opens, every symbol resolves, the version is NCCL 2.28.9's, a unique id can
// be made; a bad library path or a library without NCCL's symbols is a FailedPrecondition naming
// the path (and the symbol) with dlerror()'s text; BRAID_NCCL_LIBRARY selects the path.
#include "backends/nccl/nccl_library.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backends/nccl/nccl_api.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/nccl/unique_id.h"
#include "comm/options.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"

namespace braid::nccl {
namespace {

using braid::testing::ExpectError;

constexpr char kMissing[] = "/nonexistent/braid-test/libnccl.so.2";

TEST(NcclLibrary, RealLibraryLoadsWithEverySymbolAndVersion22809) {
  auto lib = NcclLibrary::Open(kDefaultNcclLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status();
  EXPECT_EQ((*lib)->version(), 22809);  // NCCL 2.28.9
  EXPECT_EQ((*lib)->version(), NCCL_VERSION_CODE);
  // Every slot of the function table is filled: the table is exactly the named symbols.
  const std::vector<std::string> names = NcclLibrary::SymbolNames();
  ASSERT_EQ(sizeof(NcclFunctions), names.size() * sizeof(void*));
  void* slots[sizeof(NcclFunctions) / sizeof(void*)];
  std::memcpy(slots, &(*lib)->fn(), sizeof(slots));
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_NE(slots[i], nullptr) << names[i];
  }
  EXPECT_EQ(names.front(), "ncclGetVersion");
  EXPECT_NE(std::find(names.begin(), names.end(), "ncclCommInitRankConfig"), names.end());
  int version = 0;
  ASSERT_EQ((*lib)->fn().GetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, 22809);
}

TEST(NcclLibrary, MissingLibraryNamesThePathAndDlerror) {
  ExpectError(NcclLibrary::Open(kMissing).status(), absl::StatusCode::kFailedPrecondition,
              {kMissing, "dlopen failed", "No such file", "BRAID_NCCL_LIBRARY"});
  ExpectError(NcclLibrary::Open("").status(), absl::StatusCode::kInvalidArgument,
              {"BRAID_NCCL_LIBRARY"});
}

TEST(NcclLibrary, LibraryWithoutNcclNamesTheMissingSymbol) {
  // libm loads fine but has none of NCCL's functions: the first one is reported.
  ExpectError(NcclLibrary::Open("libm.so.6").status(), absl::StatusCode::kFailedPrecondition,
              {"libm.so.6", "symbol 'ncclGetVersion'", "not found", "undefined symbol"});
}

TEST(RealNcclApi, LoadsAtFirstUseAndMakesUniqueIdsWithoutGpu) {
  std::shared_ptr<NcclApi> nccl = RealNcclApi();
  ASSERT_TRUE(nccl->Ready().ok()) << nccl->Ready();
  auto a = NewUniqueIdBytes(*nccl);
  auto b = NewUniqueIdBytes(*nccl);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->size(), kUniqueIdBytes);
  EXPECT_NE(*a, std::string(kUniqueIdBytes, '\0'));
  EXPECT_NE(*a, *b);  // each id is a fresh bootstrap root
  // Calls go to the library itself (its own text for a result code).
  EXPECT_NE(std::string(nccl->GetErrorString(ncclInvalidArgument)).find("invalid argument"),
            std::string::npos)
      << nccl->GetErrorString(ncclInvalidArgument);
}

TEST(RealNcclApi, BadLibraryFailsEveryEntryPointNamingThePath) {
  std::shared_ptr<NcclApi> nccl = RealNcclApi(kMissing);
  ExpectError(nccl->Ready(), absl::StatusCode::kFailedPrecondition, {kMissing, "dlopen"});
  ncclUniqueId id;
  EXPECT_EQ(nccl->GetUniqueId(&id), ncclSystemError);
  EXPECT_NE(std::string(nccl->GetErrorString(ncclSystemError)).find(kMissing), std::string::npos);
  EXPECT_STREQ(nccl->GetLastError(nullptr), "");
  ExpectError(NewUniqueIdBytes(*nccl).status(), absl::StatusCode::kFailedPrecondition, {kMissing});
  // The backend reports the library before looking for a GPU.
  NcclBackendConfig config;
  config.device = -1;
  ExpectError(NcclBackend::CreateFromUniqueId(RealApis(kMissing), std::string(kUniqueIdBytes, 'x'),
                                              1, 0, config)
                  .status(),
              absl::StatusCode::kFailedPrecondition, {kMissing, "dlopen failed"});
}

TEST(RealNcclApi, OptionNamesTheLibrary) {
  auto d = Options::FromMap({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->nccl_library, "libnccl.so.2");
  auto o = Options::FromMap({{"BRAID_NCCL_LIBRARY", kMissing}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->nccl_library, kMissing);
  EXPECT_TRUE(o->unknown.empty());
  ExpectError(Options::FromMap({{"BRAID_NCCL_LIBRARY", ""}}).status(),
              absl::StatusCode::kInvalidArgument, {"BRAID_NCCL_LIBRARY"});
  // The registry's factory (the mpirun path) honours it before touching CUDA or MPI.
  Options with_bad = *o;
  with_bad.backend = "nccl";
  ExpectError(CreateBackend(with_bad).status(), absl::StatusCode::kFailedPrecondition,
              {kMissing, "dlopen failed"});
}

}  // namespace
}  // namespace braid::nccl
