// How the `plugin` backend fails: every way loading can go wrong (each error's code, and its
// message naming the file and the problem), table checks, the status mapping of the ABI, and
// errors raised by a loaded plugin: a refused launch, an error delivered through the
// completion callback (before the launch returns, and later from another thread after a peer
// failed), and NULL optional entries.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "backends/plugin/abi_convert.h"
#include "backends/plugin/braid_backend_v1.h"
#include "backends/plugin/plugin_library.h"
#include "comm/backend.h"
#include "gtest/gtest.h"
#include "tests/collective_check.h"
#include "tests/multirank.h"
#include "tests/plugin_test_util.h"

namespace braid::testing {
namespace {

using ::absl::StrContains;

absl::Status CreateError(const std::string& path) {
  auto b = CreateBackend(PluginOptions(path, 2));
  return b.ok() ? absl::InternalError("backend was created") : b.status();
}

// ---- loading ----------------------------------------------------------------------------

// A plugin that fills its error buffer without a terminating NUL: the host reads the buffer up
// to its end, never past it (found by tests/fuzz/plugin_abi_fuzz; ASan caught the overread).
TEST(PluginAbi, ErrorTextStopsAtTheBufferEnd) {
  braid_backend_error_v1 err;
  std::memset(err.message, 'x', sizeof(err.message));
  EXPECT_EQ(plugin::AbiErrorText(err), std::string(sizeof(err.message), 'x'));
  std::snprintf(err.message, sizeof(err.message), "rank 3 is outside");
  EXPECT_EQ(plugin::AbiErrorText(err), "rank 3 is outside");
}

// An error with an empty message reaches the plugin's buffer as "" (UBSan caught a memcpy from
// the empty message's null data(); found by tests/fuzz/plugin_abi under libFuzzer).
TEST(PluginAbi, EmptyErrorMessageIsReportedEmpty) {
  braid_backend_error_v1 err;
  std::memset(err.message, 'x', sizeof(err.message));
  EXPECT_EQ(plugin::ReportAbiError(absl::InternalError(""), &err), BRAID_BACKEND_INTERNAL);
  EXPECT_EQ(plugin::AbiErrorText(err), "");
}

TEST(PluginLoad, EmptyPathNamesTheVariable) {
  const absl::Status s = CreateError("");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(StrContains(s.message(), "BRAID_BACKEND_PLUGIN")) << s;
}

TEST(PluginLoad, MissingFileIsNotFoundWithPathAndLoaderText) {
  const std::string path = "tests/plugins/libdoes_not_exist.so";
  const absl::Status s = CreateError(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(StrContains(s.message(), path)) << s;
  EXPECT_TRUE(StrContains(s.message(), "cannot open shared object file")) << s;  // dlerror
}

TEST(PluginLoad, FileThatIsNotALibraryIsFailedPrecondition) {
  const absl::Status s = CreateError(kNotALibrary);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(StrContains(s.message(), kNotALibrary)) << s;
  EXPECT_TRUE(StrContains(s.message(), "dlopen")) << s;
}

TEST(PluginLoad, WrongAbiVersionNamesBothVersions) {
  const absl::Status s = CreateError(kAbi99Plugin);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(
      StrContains(s.message(), absl::StrCat("plugin '", kAbi99Plugin, "' has ABI version 99")))
      << s;
  EXPECT_TRUE(StrContains(s.message(), "this Braid supports 1")) << s;
}

TEST(PluginLoad, MissingSymbolNamesTheSymbol) {
  const absl::Status s = CreateError(kNoSymbolPlugin);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(StrContains(s.message(), kNoSymbolPlugin)) << s;
  EXPECT_TRUE(StrContains(s.message(), "exports no braidBackendPlugin_v1 symbol")) << s;
}

TEST(PluginLoad, OnlyAnUnknownVersionSaysWhichItFound) {
  const absl::Status s = CreateError(kV2OnlyPlugin);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(StrContains(s.message(), kV2OnlyPlugin)) << s;
  EXPECT_TRUE(StrContains(s.message(), "exports braidBackendPlugin_v2 (ABI version 2)")) << s;
  EXPECT_TRUE(StrContains(s.message(), "this Braid supports ABI version 1")) << s;
}

TEST(PluginLoad, BackendIsRegisteredByName) {
  const std::vector<std::string> names = BackendRegistry::Global().Names();
  EXPECT_NE(std::find(names.begin(), names.end(), "plugin"), names.end());
}

// ---- table checks (no library needed) ---------------------------------------------------

braid_backend_v1 CompleteTable() {
  braid_backend_v1 t{};
  t.abi_version = BRAID_BACKEND_ABI_VERSION;
  t.struct_size = sizeof(braid_backend_v1);
  t.name = "unit";
  t.init = [](braid_backend_log_fn_v1, void*, int, int64_t, void**, braid_backend_error_v1*) {
    return 0;
  };
  t.finalize = [](void*, braid_backend_error_v1*) { return 0; };
  t.world_size = [](void*, int*, braid_backend_error_v1*) { return 0; };
  t.local_ranks = [](void*, int*, int, int*, braid_backend_error_v1*) { return 0; };
  t.comm_create_world = [](void*, int, void**, braid_backend_error_v1*) { return 0; };
  t.comm_info = [](void*, int*, int*, braid_backend_error_v1*) { return 0; };
  t.comm_destroy = [](void*, braid_backend_error_v1*) { return 0; };
  return t;
}

TEST(PluginTable, CompleteTableWithoutOptionalEntriesIsAccepted) {
  EXPECT_OK(plugin::ValidateTableV1("libunit.so", CompleteTable()));
}

TEST(PluginTable, SmallStructSizeIsRefused) {
  braid_backend_v1 t = CompleteTable();
  t.struct_size = 16;
  const absl::Status s = plugin::ValidateTableV1("libunit.so", t);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(StrContains(s.message(), "libunit.so")) << s;
  EXPECT_TRUE(StrContains(s.message(), "struct_size 16")) << s;
}

TEST(PluginTable, NullRequiredEntryIsNamed) {
  braid_backend_v1 t = CompleteTable();
  t.comm_info = nullptr;
  const absl::Status s = plugin::ValidateTableV1("libunit.so", t);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(StrContains(s.message(), "required entry comm_info NULL")) << s;
}

TEST(PluginTable, NullNameIsRefused) {
  braid_backend_v1 t = CompleteTable();
  t.name = nullptr;
  const absl::Status s = plugin::ValidateTableV1("libunit.so", t);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(StrContains(s.message(), "NULL name")) << s;
}

// ---- status mapping ---------------------------------------------------------------------

TEST(PluginStatus, CodesRoundTrip) {
  const absl::StatusCode codes[] = {
      absl::StatusCode::kInvalidArgument, absl::StatusCode::kUnimplemented,
      absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kAborted, absl::StatusCode::kInternal};
  for (absl::StatusCode c : codes) {
    const absl::Status in(c, "why");
    const absl::Status out = plugin::FromAbiStatus(plugin::ToAbiStatus(in), "why");
    EXPECT_EQ(out, in);
  }
  EXPECT_EQ(plugin::ToAbiStatus(absl::OkStatus()), BRAID_BACKEND_OK);
  EXPECT_TRUE(plugin::FromAbiStatus(BRAID_BACKEND_OK, nullptr).ok());
  const absl::Status unknown = plugin::FromAbiStatus(42, "odd");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(StrContains(unknown.message(), "unknown status code 42: odd")) << unknown;
}

TEST(PluginStatus, ReportTruncatesLongMessages) {
  braid_backend_error_v1 e;
  const int rc = plugin::ReportAbiError(absl::InvalidArgumentError(std::string(5000, 'x')), &e);
  EXPECT_EQ(rc, BRAID_BACKEND_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(e.message), std::string(sizeof(e.message) - 1, 'x'));
}

// ---- errors from a loaded plugin (libbraid_test_faulty_plugin.so) -----------------------

// abort_on_failure = false (BRAID_ABORT_ON_FAILURE=0): a failure fails only its own call, so a
// test can watch one error path alone (with the job's abort, tests/plugin_abort_test.cc).
std::unique_ptr<Backend> CreateFaulty(int ranks, bool abort_on_failure = true) {
  Options o = PluginOptions(kFaultyPlugin, ranks);
  o.abort_on_failure = abort_on_failure;
  auto b = CreateBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

TEST(PluginErrors, RefusedLaunchIsAnErrorRightAway) {
  // The barrier below fails (timed out) on each rank: without abort_on_failure = false the
  // first one would abort the job, refusing the other rank's calls.
  std::unique_ptr<Backend> backend = CreateFaulty(2, /*abort_on_failure=*/false);
  ASSERT_NE(backend, nullptr);
  RunRanks(*backend, [](Group& g) {
    std::vector<float> send(5, 1.0f), recv(10);
    auto w = g.AllGather(send.data(), recv.data(), send.size(), DType::kF32);
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
    EXPECT_TRUE(StrContains(w.status().message(),
                            "plugin 'braid_test_faulty': allgather #0 on group 'world': "
                            "faulty test plugin refuses all_gather of 5 elements"))
        << w.status();
    // A refused launch consumes no sequence number.
    auto b = g.Barrier();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ((*b)->info().seq, 0u);
  });
}

TEST(PluginErrors, CallbackErrorBeforeLaunchReturns) {
  std::unique_ptr<Backend> backend = CreateFaulty(2, /*abort_on_failure=*/false);
  ASSERT_NE(backend, nullptr);
  RunRanks(*backend, [](Group& g) {
    auto w = g.Barrier();
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE((*w)->Done());  // the plugin called back inside the launch
    const absl::Status s = (*w)->Wait(absl::Seconds(5));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_TRUE(StrContains(s.message(),
                            "plugin 'braid_test_faulty': barrier #0 on group "
                            "'world': faulty test plugin: barrier timed out"))
        << s;
  });
}

TEST(PluginErrors, PeerFailureReachesEveryRankThroughTheCallback) {
  std::unique_ptr<Backend> backend = CreateFaulty(3);
  ASSERT_NE(backend, nullptr);
  RunRanks(*backend, [](Group& g) {
    // Collective #0 of the wrapped world works; at #1 the plugin makes world rank 1 fail.
    EXPECT_OK(RunAndCheck(
        g, {CollectiveKind::kAllReduce, ReduceKind::kSum, DType::kF32, 64, false, false, 5}));
    std::vector<float> buf(64, 1.0f);
    auto w = g.AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum());
    // Launched fine and failed asynchronously, or, on a rank that launched after rank 1 had
    // failed, refused by the wrapped local world's job abort (comm/abort_domain.h).
    const absl::Status s = w.ok() ? (*w)->Wait(absl::Seconds(30)) : w.status();
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(StrContains(s.message(),
                            "plugin 'braid_test_faulty': allreduce #1 on group "
                            "'world'"))
        << s;
    EXPECT_TRUE(StrContains(s.message(), "rank 1 failed: injected by the test plugin")) << s;
  });
}

TEST(PluginErrors, NullOptionalEntriesAreUnimplementedNamingThem) {
  std::unique_ptr<Backend> backend = CreateFaulty(2);
  ASSERT_NE(backend, nullptr);
  // capabilities is NULL: host memory only, no other claim; comm_split is NULL: no split.
  const Capabilities c = backend->capabilities();
  EXPECT_TRUE(c.host_memory);
  EXPECT_FALSE(c.native_avg);
  EXPECT_FALSE(c.async_progress);
  EXPECT_FALSE(c.split);
  RunRanks(*backend, [](Group& g) {
    std::vector<int32_t> buf(8);
    auto w = g.Broadcast(buf.data(), buf.size(), DType::kI32, 0);
    EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented) << w.status();
    EXPECT_TRUE(StrContains(w.status().message(),
                            "plugin 'braid_test_faulty' does not implement broadcast"))
        << w.status();
    auto child = g.Split(0, 0);
    EXPECT_EQ(child.status().code(), absl::StatusCode::kUnimplemented) << child.status();
    EXPECT_TRUE(StrContains(child.status().message(), "does not implement comm_split"))
        << child.status();
  });
}

}  // namespace
}  // namespace braid::testing
