// The `plugin` backend end to end, through libbraid_test_plugin.so (Braid's local backend
// behind the C ABI of backends/plugin/braid_backend_v1.h): every collective x reduce op x
// dtype x rank count x in-place/out-of-place at sizes 0, 1, odd and large, bit for bit
// against the serial reference; splits; many operations in flight; the plugin's log lines in
// Braid's logger; groups outliving the backend; destroying a group with work in flight.
// Loader and launch errors are in plugin_errors_test.cc.
#include <memory>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/backend.h"
#include "comm/logging.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ostream_sink.h"
#include "tests/collective_check.h"
#include "tests/multirank.h"
#include "tests/plugin_test_util.h"

namespace braid::testing {
namespace {

std::unique_ptr<Backend> CreatePluginBackend(int ranks) {
  auto b = CreateBackend(PluginOptions(kLocalPlugin, ranks));
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(*b) : nullptr;
}

// ---- every collective, bit for bit ------------------------------------------------------

using Param = std::tuple<int /*kind index*/, DType, int /*ranks*/, bool /*in_place*/>;

class PluginCollectives : public ::testing::TestWithParam<Param> {};

TEST_P(PluginCollectives, MatchesSerialReference) {
  const auto [ki, dtype, ranks, in_place] = GetParam();
  const CollectiveVariant k = kCollectiveVariants[ki];
  if (const char* why = MatrixSkipReason(k, dtype, in_place)) GTEST_SKIP() << why;
  std::unique_ptr<Backend> backend = CreatePluginBackend(ranks);
  ASSERT_NE(backend, nullptr);
  ASSERT_EQ(backend->world_size(), ranks);
  if (RefusedUpFront(k, dtype)) {
    // Braid rejects it before the plugin sees it, naming the dtype.
    RunRanks(*backend, [&](Group& g) {
      const absl::Status s = LaunchStatus(g, k.kind, dtype, k.op);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_NE(s.message().find(CollectiveName(k.kind)), absl::string_view::npos) << s;
      EXPECT_NE(s.message().find(DTypeName(dtype)), absl::string_view::npos) << s;
    });
    return;
  }
  RunRanks(*backend, [&](Group& g) {
    EXPECT_EQ(g.backend_name(), "plugin");
    EXPECT_OK(CheckAllSizes(g, k, dtype, in_place));
  });
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [ki, dtype, ranks, in_place] = info.param;
  return MatrixCaseName(kCollectiveVariants[ki], dtype, ranks, in_place);
}

INSTANTIATE_TEST_SUITE_P(
    All, PluginCollectives,
    ::testing::Combine(::testing::Range(0, static_cast<int>(std::size(kCollectiveVariants))),
                       ::testing::ValuesIn(kAllDTypes), ::testing::Values(1, 2, 3, 4),
                       ::testing::Bool()),
    ParamName);

// ---- what the plugin reports ------------------------------------------------------------

TEST(PluginBackend, WorldRanksAndCapabilitiesComeFromThePlugin) {
  std::unique_ptr<Backend> backend = CreatePluginBackend(3);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "plugin");
  EXPECT_EQ(backend->world_size(), 3);
  EXPECT_EQ(backend->local_ranks(), (std::vector<int>{0, 1, 2}));
  const Capabilities c = backend->capabilities();  // the local backend's, through the bitmask
  EXPECT_TRUE(c.host_memory);
  EXPECT_FALSE(c.device_memory);
  EXPECT_FALSE(c.device_events);
  EXPECT_TRUE(c.native_avg);
  EXPECT_TRUE(c.native_premul_sum);
  EXPECT_TRUE(c.native_half);
  EXPECT_TRUE(c.async_progress);
  EXPECT_TRUE(c.split);
  EXPECT_TRUE(c.deterministic);
  RunRanks(*backend, [](Group& g) {
    EXPECT_EQ(g.size(), 3);
    EXPECT_EQ(g.name(), "world");
    EXPECT_TRUE(g.capabilities().split);
  });
  // A world group is handed out once per rank, and only for local ranks.
  EXPECT_EQ(backend->WorldGroup(1).status().code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status outside = backend->WorldGroup(7).status();
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(outside.message(), "rank 7")) << outside;
}

// ---- split ------------------------------------------------------------------------------

TEST(PluginSplit, ChildGroupsRunCollectives) {
  std::unique_ptr<Backend> backend = CreatePluginBackend(4);
  ASSERT_NE(backend, nullptr);
  RunRanks(*backend, [](Group& world) {
    const int r = world.rank();
    // Colors: ranks 0 and 2 -> 0 (ordered by key: 2 first), rank 1 -> 1 alone, rank 3 none.
    const int color = r == 3 ? kNoColor : r % 2;
    auto child = world.Split(color, /*key=*/-r);
    ASSERT_TRUE(child.ok()) << child.status();
    if (r == 3) {
      EXPECT_EQ(*child, nullptr);
    } else {
      ASSERT_NE(*child, nullptr);
      Group& g = **child;
      EXPECT_EQ(g.name(), absl::StrCat("world/", color));
      EXPECT_EQ(g.backend_name(), "plugin");
      EXPECT_EQ(g.size(), color == 0 ? 2 : 1);
      EXPECT_EQ(g.rank(), r == 0 ? 1 : 0);  // color 0 is ordered (rank 2, rank 0)
      EXPECT_OK(RunAndCheck(
          g, {CollectiveKind::kAllReduce, ReduceKind::kSum, DType::kF32, 1000, false, false, 11}));
      EXPECT_OK(RunAndCheck(g, {CollectiveKind::kReduceScatter, ReduceKind::kAvg, DType::kBF16, 37,
                                true, false, 12}));
      EXPECT_OK(RunAndCheck(
          g, {CollectiveKind::kAllGather, ReduceKind::kSum, DType::kI32, 37, false, false, 13}));
    }
    // The parent keeps working after the split.
    EXPECT_OK(RunAndCheck(
        world, {CollectiveKind::kAllReduce, ReduceKind::kMax, DType::kI32, 37, false, false, 14}));
  });
}

TEST(PluginSplit, BadColorIsAnErrorOnEveryRankNamingTheRank) {
  std::unique_ptr<Backend> backend = CreatePluginBackend(3);
  ASSERT_NE(backend, nullptr);
  RunRanks(*backend, [](Group& world) {
    auto child = world.Split(world.rank() == 1 ? -5 : 0, 0);
    ASSERT_FALSE(child.ok());
    EXPECT_EQ(child.status().code(), absl::StatusCode::kInvalidArgument) << child.status();
    EXPECT_TRUE(absl::StrContains(child.status().message(), "plugin 'braid_test_local'"))
        << child.status();
    EXPECT_TRUE(absl::StrContains(child.status().message(), "rank 1 passed color -5"))
        << child.status();
  });
}

// ---- asynchrony and lifetime ------------------------------------------------------------

TEST(PluginAsync, ManyInFlightThenWaitAll) {
  std::unique_ptr<Backend> backend = CreatePluginBackend(3);
  ASSERT_NE(backend, nullptr);
  RunRanks(*backend, [](Group& g) {
    constexpr int kOps = 50;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(33));
    std::vector<WorkPtr> works;
    for (int i = 0; i < kOps; ++i) {
      for (size_t j = 0; j < bufs[i].size(); ++j) bufs[i][j] = static_cast<float>(i + g.rank() + j);
      CollectiveOptions opts;
      opts.label = "bucket";
      auto w = g.AllReduce(bufs[i].data(), bufs[i].data(), bufs[i].size(), DType::kF32,
                           ReduceOp::Sum(), opts);
      ASSERT_TRUE(w.ok()) << w.status();
      works.push_back(*w);
    }
    for (int i = 0; i < kOps; ++i) {
      ASSERT_OK(works[i]->Wait(absl::Seconds(30)));
      EXPECT_EQ(works[i]->info().seq, static_cast<uint64_t>(i));
      EXPECT_EQ(works[i]->info().group, "world");
      EXPECT_EQ(works[i]->info().label, "bucket");
      for (size_t j = 0; j < bufs[i].size(); ++j) {
        ASSERT_EQ(bufs[i][j], static_cast<float>(3 * (i + j) + 0 + 1 + 2)) << i << "," << j;
      }
    }
  });
}

TEST(PluginLifetime, GroupsOutliveTheBackend) {
  std::vector<std::unique_ptr<Group>> groups;
  {
    std::unique_ptr<Backend> backend = CreatePluginBackend(2);
    ASSERT_NE(backend, nullptr);
    for (int r : backend->local_ranks()) {
      auto g = backend->WorldGroup(r);
      ASSERT_TRUE(g.ok()) << g.status();
      groups.push_back(std::move(*g));
    }
  }  // the backend is gone; the groups keep the plugin loaded and initialized
  std::vector<std::thread> threads;
  for (auto& g : groups) {
    threads.emplace_back([group = g.get()] {
      EXPECT_OK(RunAndCheck(*group, {CollectiveKind::kAllReduce, ReduceKind::kSum, DType::kF32, 100,
                                     true, false, 3}));
    });
  }
  for (auto& t : threads) t.join();
  groups.clear();  // the last comm_destroy, then finalize, then dlclose
}

TEST(PluginLifetime, DestroyingAGroupCompletesItsWorkFirst) {
  std::unique_ptr<Backend> backend = CreatePluginBackend(2);
  ASSERT_NE(backend, nullptr);
  auto g0 = backend->WorldGroup(0);
  auto g1 = backend->WorldGroup(1);
  ASSERT_TRUE(g0.ok() && g1.ok());
  std::vector<float> buf(16, 1.0f);
  // Rank 1 never joins: rank 0's all-reduce can only end when its group is destroyed.
  auto w = (*g0)->AllReduce(buf.data(), buf.data(), buf.size(), DType::kF32, ReduceOp::Sum());
  ASSERT_TRUE(w.ok()) << w.status();
  g0->reset();  // comm_destroy must run the pending callback before it returns
  ASSERT_TRUE((*w)->Done());
  const absl::Status s = (*w)->status();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(absl::StrContains(s.message(),
                                "plugin 'braid_test_local': allreduce #0 on group "
                                "'world'"))
      << s;
}

// ---- logging ----------------------------------------------------------------------------

TEST(PluginLogging, PluginLinesReachBraidsLogger) {
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  spdlog::logger& log = Log();
  const auto old_level = log.level();
  log.sinks().push_back(sink);
  {
    Options o = PluginOptions(kLocalPlugin, 2);
    o.log_level = "info";  // CreateBackend applies it to Braid's logger
    auto backend = CreateBackend(o);
    EXPECT_TRUE(backend.ok()) << backend.status();
  }
  log.set_level(old_level);
  log.sinks().pop_back();
  const std::string text = captured.str();
  // Written by the plugin's init through the host log callback, prefixed by Braid.
  EXPECT_TRUE(absl::StrContains(
      text, "plugin 'braid_test_local': wrapping the local backend: world of 2 ranks"))
      << text;
  // Written by Braid itself once the plugin is loaded.
  EXPECT_TRUE(absl::StrContains(text, "loaded backend plugin 'braid_test_local'")) << text;
}

}  // namespace
}  // namespace braid::testing
