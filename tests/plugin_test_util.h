// Paths of the test plugins (tests/plugins/) and options that load one. Bazel runs a test in
// its runfiles tree, so a `data` dependency lives at its workspace-relative path.
//
//   ASSIGN_OR_RETURN(auto backend, CreateBackend(PluginOptions(kLocalPlugin, 4)));
#ifndef BRAID_TESTS_PLUGIN_TEST_UTIL_H_
#define BRAID_TESTS_PLUGIN_TEST_UTIL_H_

#include <string>

#include "absl/time/time.h"
#include "comm/options.h"
#include "tests/multirank.h"

namespace braid::testing {

// (a) the local backend behind the C ABI, every entry present.
inline constexpr char kLocalPlugin[] = "tests/plugins/libbraid_test_plugin.so";
// The same with faults (tests/plugins/faulty_plugin_table.cc).
inline constexpr char kFaultyPlugin[] = "tests/plugins/libbraid_test_faulty_plugin.so";
// (b) abi_version 99.
inline constexpr char kAbi99Plugin[] = "tests/plugins/libbraid_test_abi99_plugin.so";
// (c) a shared library without the symbol.
inline constexpr char kNoSymbolPlugin[] = "tests/plugins/libbraid_test_no_symbol_plugin.so";
// Exports braidBackendPlugin_v2 only.
inline constexpr char kV2OnlyPlugin[] = "tests/plugins/libbraid_test_v2_only_plugin.so";
// A file that exists but is not a shared library.
inline constexpr char kNotALibrary[] = "tests/plugins/export_v1.lds";

// Backend "plugin" loading `path`, asking for a world of `ranks`.
inline Options PluginOptions(const std::string& path, int ranks,
                             absl::Duration timeout = absl::Seconds(60)) {
  Options o = LocalOptions(ranks, timeout);
  o.backend = "plugin";
  o.plugin_path = path;
  return o;
}

}  // namespace braid::testing

#endif  // BRAID_TESTS_PLUGIN_TEST_UTIL_H_
