#include "comm/options.h"

#include "gtest/gtest.h"

namespace braid {
namespace {

TEST(Options, DefaultsAndParsing) {
  auto o = Options::FromMap({});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->backend, "local");
  EXPECT_EQ(o->timeout, absl::Seconds(300));
  o = Options::FromMap({{"BRAID_BACKEND", "mpi"},
                        {"BRAID_TIMEOUT_MS", "1500"},
                        {"BRAID_LOCAL_RANKS", "8"},
                        {"BRAID_SPIN_US", "0"},
                        {"BRAID_VALIDATE_COLLECTIVES", "1"},
                        {"BRAID_BACKEND_PLUGIN", "/x/y.so"},
                        {"PATH", "/bin"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->backend, "mpi");
  EXPECT_EQ(o->timeout, absl::Milliseconds(1500));
  EXPECT_EQ(o->local_ranks, 8);
  EXPECT_EQ(o->spin, absl::ZeroDuration());
  EXPECT_TRUE(o->validate_collectives);
  EXPECT_EQ(o->plugin_path, "/x/y.so");
  EXPECT_TRUE(o->unknown.empty());
}

TEST(Options, BadValuesNameTheVariable) {
  for (const auto& [k, v] :
       std::vector<std::pair<std::string, std::string>>{{"BRAID_TIMEOUT_MS", "soon"},
                                                        {"BRAID_TIMEOUT_MS", "0"},
                                                        {"BRAID_LOCAL_RANKS", "-2"},
                                                        {"BRAID_LOG_LEVEL", "loud"},
                                                        {"BRAID_VALIDATE_COLLECTIVES", "yes"}}) {
    auto o = Options::FromMap({{k, v}});
    ASSERT_FALSE(o.ok()) << k << "=" << v;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(k), absl::string_view::npos) << o.status();
    EXPECT_NE(o.status().message().find(v), absl::string_view::npos) << o.status();
  }
}

TEST(Options, UnknownBraidVariablesAreReported) {
  auto o = Options::FromMap({{"BRAID_TIMEOUT_SECS", "3"}});
  ASSERT_TRUE(o.ok());
  ASSERT_EQ(o->unknown.size(), 1u);
  EXPECT_EQ(o->unknown[0], "BRAID_TIMEOUT_SECS");
}

TEST(Options, EveryVariableIsDocumented) {
  ASSERT_GE(OptionSpecs().size(), 8u);
  std::map<std::string, std::string> defaults;
  for (const OptionSpec& s : OptionSpecs()) {
    EXPECT_FALSE(s.help.empty()) << s.name;
    defaults[std::string(s.name)] = std::string(s.default_value);
  }
  // The documented defaults parse and equal the struct's defaults.
  auto from_defaults = Options::FromMap(defaults);
  ASSERT_TRUE(from_defaults.ok()) << from_defaults.status();
  const Options plain;
  EXPECT_EQ(from_defaults->backend, plain.backend);
  EXPECT_EQ(from_defaults->timeout, plain.timeout);
  EXPECT_EQ(from_defaults->spin, plain.spin);
  EXPECT_EQ(from_defaults->local_ranks, plain.local_ranks);
  EXPECT_EQ(from_defaults->log_level, plain.log_level);
  EXPECT_EQ(from_defaults->store_port, plain.store_port);
}

TEST(Options, StorePort) {
  auto o = Options::FromMap({{"BRAID_STORE_PORT", "29600"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->store_port, 29600);
  for (const char* bad : {"-1", "65536", "port"}) {
    auto b = Options::FromMap({{"BRAID_STORE_PORT", bad}});
    EXPECT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("BRAID_STORE_PORT"), absl::string_view::npos);
  }
}

TEST(Options, FromEnvReadsEnvironment) {
  setenv("BRAID_TIMEOUT_MS", "4242", 1);
  auto o = Options::FromEnv();
  unsetenv("BRAID_TIMEOUT_MS");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->timeout, absl::Milliseconds(4242));
}

}  // namespace
}  // namespace braid
