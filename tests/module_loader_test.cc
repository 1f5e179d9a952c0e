// Backend modules (backends/module/): the real libbraid-gloo.so loaded into a binary that does
// not link the gloo backend, a world created through it and used across the boundary (the
// contract's point: Backend, Group and Work objects of the module's own comm/ copy driven by
// this binary's), and every way loading fails, each naming the module, the system library and
// its Debian package: no module, a missing system library, a file that is not a module, a
// module of another backend, a module built from other headers (interface stamp).
#include "backends/module/module_loader.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "backends/module/backend_module.h"
#include "comm/backend.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"

namespace braid::testing {
namespace {

using module::BackendModuleV1;
using module::LoadModule;
using module::ModuleSpec;

constexpr char kModules[] = "capi";  // runfiles: //capi:libbraid-gloo.so, libbraid-mpi.so

ModuleSpec Gloo() {
  return ModuleSpec{"gloo", "test", "libbraid-gloo.so", "libgloo.so.0", "Gloo", "libgloo0"};
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A copy of the gloo module in a fresh directory with `from` replaced by `to` (same length,
// so the ELF stays valid); returns the directory.
std::string PatchedCopy(const std::string& name, const std::string& from, const std::string& to) {
  EXPECT_EQ(from.size(), to.size());
  std::string blob = Read(absl::StrCat(kModules, "/libbraid-gloo.so"));
  EXPECT_NE(blob.find(from), std::string::npos) << from;
  blob = absl::StrReplaceAll(blob, {{from, to}});
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  mkdir(dir.c_str(), 0755);
  std::ofstream(absl::StrCat(dir, "/libbraid-gloo.so"), std::ios::binary) << blob;
  return dir;
}

TEST(ModuleLoader, CreatesAWorldThroughTheModule) {
  absl::StatusOr<const BackendModuleV1*> m = LoadModule(Gloo(), kModules);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_STREQ((*m)->name, "gloo");
  EXPECT_STREQ((*m)->interface_stamp, module::kInterfaceStamp);
  // Loading again returns the module already loaded.
  absl::StatusOr<const BackendModuleV1*> again = LoadModule(Gloo(), kModules);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *m);

  Options o;
  o.backend = "gloo";
  o.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<Backend>> b = (*m)->create(o);  // one rank, no launcher
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "gloo");
  ASSERT_EQ((*b)->local_ranks(), std::vector<int>{0});
  absl::StatusOr<std::unique_ptr<Group>> world = (*b)->WorldGroup(0);
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ((*world)->size(), 1);
  std::vector<float> x = {1.5f, -2.0f, 3.25f}, y(3, 0.0f);
  absl::StatusOr<WorkPtr> w =
      (*world)->AllReduce(x.data(), y.data(), x.size(), DType::kF32, ReduceOp::Sum());
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_OK((*w)->Wait(absl::Seconds(30)));
  EXPECT_EQ(y, x);
  world->reset();
  b->reset();
}

// Through the registry, as libbraid.so does it: this binary links no gloo backend, only the
// module registration, and BRAID_BACKEND_MODULE_DIR (Options::backend_module_dir) finds it.
TEST(ModuleLoader, RegistryLoadsTheModuleOnFirstCreate) {
  static const module::ModuleRegistration registration(Gloo());
  Options o;
  o.backend = "gloo";
  o.backend_module_dir = "/nonexistent/modules";
  ExpectError(CreateBackend(o).status(), absl::StatusCode::kFailedPrecondition,
              {"backend 'gloo'", "libbraid-gloo.so", "/nonexistent/modules",
               "BRAID_BACKEND_MODULE_DIR", "libgloo.so.0", "apt install libgloo0"});
  o.backend_module_dir = kModules;  // a failed load is retried
  absl::StatusOr<std::unique_ptr<Backend>> b = CreateBackend(o);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->world_size(), 1);
}

// The default is the directory of the file holding the loader's code (libbraid.so; here the
// test binary or Bazel's per-library .so), as /proc/self/maps says, symlinks resolved.
TEST(ModuleLoader, DefaultDirectoryIsThatOfTheObjectHoldingTheLoader) {
  absl::StatusOr<std::string> dir = module::ModuleDirectory(Options());
  ASSERT_TRUE(dir.ok()) << dir.status();
  const auto code = reinterpret_cast<uintptr_t>(&module::ModuleDirectory);
  std::ifstream maps("/proc/self/maps");
  std::string line, holder;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    char path[4096] = "";
    if (std::sscanf(line.c_str(), "%lx-%lx %*s %*s %*s %*s %4095s", &lo, &hi, path) == 3 &&
        lo <= code && code < hi) {
      holder = path;
    }
  }
  ASSERT_FALSE(holder.empty()) << "no mapping holds ModuleDirectory";
  std::unique_ptr<char, decltype(&free)> real(realpath(holder.c_str(), nullptr), &free);
  ASSERT_NE(real, nullptr);
  const std::string real_path = real.get();
  EXPECT_EQ(*dir, real_path.substr(0, real_path.rfind('/'))) << holder;
  Options o;
  o.backend_module_dir = "/opt/braid/lib";
  EXPECT_EQ(*module::ModuleDirectory(o), "/opt/braid/lib");
}

TEST(ModuleLoader, MissingSystemLibraryIsNamedWithItsPackage) {
  const std::string dir = PatchedCopy("nolib", "libgloo.so.0", "lbxgloo.so.0");
  ExpectError(LoadModule(Gloo(), dir).status(), absl::StatusCode::kFailedPrecondition,
              {"backend 'gloo' is not available", "lbxgloo.so.0", "cannot open", "libgloo.so.0",
               "apt install libgloo0"});
  // When dlerror names the spec's library itself, the message says it is not installed.
  ModuleSpec renamed = Gloo();
  renamed.system_library = "lbxgloo.so.0";
  ExpectError(LoadModule(renamed, dir).status(), absl::StatusCode::kFailedPrecondition,
              {"needs lbxgloo.so.0", "not installed", "apt install libgloo0"});
}

TEST(ModuleLoader, FilesThatAreNotThisBuildsModuleAreRefused) {
  ModuleSpec mpi_as_gloo = Gloo();
  mpi_as_gloo.backend = "mpi";
  ExpectError(LoadModule(mpi_as_gloo, kModules).status(), absl::StatusCode::kFailedPrecondition,
              {"libbraid-gloo.so", "not a backend module of this libbraid.so",
               "the module of backend 'gloo'"});

  // A shared library without the entry point (any test plugin of tests/plugins/).
  ModuleSpec plugin = Gloo();
  plugin.file = "libbraid_test_plugin.so";
  ExpectError(LoadModule(plugin, "tests/plugins").status(), absl::StatusCode::kFailedPrecondition,
              {"libbraid_test_plugin.so", "exports no braidBackendModule_v1"});

  // Built from other comm/ headers: the stamp differs.
  const std::string stamp = BRAID_MODULE_HEADERS_HASH;
  const std::string dir = PatchedCopy("stamp", stamp, std::string(stamp.size(), '0'));
  ExpectError(LoadModule(Gloo(), dir).status(), absl::StatusCode::kFailedPrecondition,
              {"not a backend module of this libbraid.so", "other Braid headers",
               std::string(stamp.size(), '0'), stamp});
}

}  // namespace
}  // namespace braid::testing
