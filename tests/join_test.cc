// scheduler/join.h on the `local` backend: ranks run out of data at different steps (world rank
// k runs k + 1 steps), the joined ones shadow the rest; every active rank's result each step is
// the serial reference (the contributing ranks' sum over the initial world size, or over the
// contributors), in all-reduce, reduce-scatter and hybrid modes; then the last joiner is the
// authoritative rank and its broadcast reaches everyone; throw_on_early_termination fails
// every rank at the first uneven step; shard_gradients reducers agree but refuse Shadow (the
// framework replays the step); hybrid reduce_scatter_only windows with ranks leaving mid-window
// keep the partial shards they hold.
#include "scheduler/join.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/mesh.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

constexpr size_t kCounts[] = {7, 3, 12, 5, 9};

// Exact in f32; sums of a few of them are exact too.
float G(int rank, int param, int step, size_t i) {
  return 0.25f * static_cast<float>(rank + 1) + static_cast<float>(i % 7) -
         0.5f * static_cast<float>(step) + static_cast<float>(param);
}

std::vector<ParamSpec> Params() {
  std::vector<ParamSpec> ps;
  for (int p = 0; p < 5; ++p) ps.push_back(ParamSpec{ParamId(10 + p), kCounts[p], DType::kF32});
  return ps;
}

struct Case {
  ReduceMode mode;
  int replicas, shards;
  bool by_world;  // divide_by_initial_world_size
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  const char* m = c.mode == ReduceMode::kAllReduce       ? "allreduce"
                  : c.mode == ReduceMode::kReduceScatter ? "reduce_scatter"
                                                         : "hybrid";
  return absl::StrCat(m, "_", c.replicas, "x", c.shards, c.by_world ? "_world" : "_contributors");
}

// What parameter `p`'s element i is after a synced step where ranks >= step contributed.
float Expected(const Case& c, int world, int step, int p, size_t i) {
  float sum = 0;
  for (int k = step; k < world; ++k) sum += G(k, p, step, i);
  return sum / static_cast<float>(c.by_world ? world : world - step);
}

// Every result of reducer `r` (views in all-reduce mode, this rank's shards otherwise) against
// want(param, element), within `tol` relative.
void CheckResults(GradientReducer& r, const std::function<float(int, size_t)>& want, float tol,
                  int step) {
  const BucketPlan& plan = r.plan();
  if (r.mode() == ReduceMode::kAllReduce) {
    for (size_t p = 0; p < plan.params().size(); ++p) {
      TensorView v = r.GradView(plan.params()[p].id).value();
      const float* x = static_cast<const float*>(v.data);
      for (size_t i = 0; i < v.count; ++i) {
        const float w = want(static_cast<int>(plan.params()[p].id - 10), i);
        ASSERT_NEAR(x[i], w, tol * std::fabs(w)) << "step " << step << " param " << p;
      }
    }
    return;
  }
  const int s = r.groups().shard->rank();
  for (size_t b = 0; b < plan.buckets().size(); ++b) {
    const Bucket& bk = plan.buckets()[b];
    std::vector<float> flat(bk.padded_count, 0.0f);
    for (int p : bk.params) {
      const int param = static_cast<int>(plan.params()[p].id - 10);
      for (size_t i = 0; i < plan.params()[p].count; ++i)
        flat[plan.slot(p).offset + i] = want(param, i);
    }
    TensorView v = r.ShardView(static_cast<int>(b));
    const float* x = static_cast<const float*>(v.data);
    for (size_t j = 0; j < bk.shard_count; ++j) {
      const float w = flat[s * bk.shard_count + j];
      ASSERT_NEAR(x[j], w, tol * std::fabs(w)) << "step " << step << " bucket " << b;
    }
  }
}

void CheckStep(const Case& c, GradientReducer& r, int world, int step) {
  CheckResults(
      r, [&](int p, size_t i) { return Expected(c, world, step, p, i); }, c.by_world ? 0.0f : 1e-5f,
      step);
}

class JoinTest : public ::testing::TestWithParam<Case> {};

TEST_P(JoinTest, UnevenRanksMatchTheContributorsReference) {
  const Case c = GetParam();
  const int world_size = c.replicas * c.shards;
  RunRanks(world_size, [&](Group& world) {
    Mesh mesh;
    ReducerGroups groups{&world, nullptr};
    if (c.mode == ReduceMode::kHybrid) {
      mesh = MakeMesh(world, c.replicas, c.shards).value();
      groups = {mesh.shard.get(), mesh.replica.get()};
    }
    ReducerConfig cfg;
    cfg.mode = c.mode;
    cfg.bucket_cap_bytes = cfg.first_bucket_cap_bytes = 48;  // several buckets
    cfg.timeout = absl::Seconds(30);
    auto reducer = GradientReducer::Create(Params(), groups, cfg);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    GradientReducer& r = **reducer;
    ASSERT_GT(r.plan().buckets().size(), 2u);
    JoinOptions jo;
    jo.divide_by_initial_world_size = c.by_world;
    auto join = Join::Create(&r, jo);
    ASSERT_TRUE(join.ok()) << join.status();
    const int me = (*join)->world_rank();
    EXPECT_EQ(me, world.rank());
    std::mt19937 rng(17 + me);
    std::vector<int> order = {0, 1, 2, 3, 4};
    for (int step = 0; step <= me; ++step) {  // rank k has k + 1 steps of data
      auto agreed = (*join)->Agree(true, SyncMode::kSync);
      ASSERT_TRUE(agreed.ok()) << agreed.status();
      EXPECT_EQ(agreed->active, world_size - step);
      ASSERT_OK(r.BeginBackward(SyncMode::kSync));
      std::shuffle(order.begin(), order.end(), rng);
      for (int p : order) {
        TensorView v = r.GradView(ParamId(10 + p)).value();
        float* x = static_cast<float*>(v.data);
        for (size_t i = 0; i < v.count; ++i) x[i] = G(me, p, step, i);
        ASSERT_OK(r.MarkReady(ParamId(10 + p)));
      }
      ASSERT_OK(r.FinishBackward());
      CheckStep(c, r, world_size, step);
      ASSERT_OK(r.ZeroGrads());
    }
    auto last = (*join)->RunJoined();
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_EQ(*last, me == world_size - 1);
    auto root = (*join)->AuthoritativeRank(*last);
    ASSERT_TRUE(root.ok()) << root.status();
    EXPECT_EQ(*root, world_size - 1);
    std::vector<double> model(3, me);
    ASSERT_OK((*join)->Broadcast(model.data(), model.size(), DType::kF64, *root));
    EXPECT_EQ(model, std::vector<double>(3, world_size - 1));
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, JoinTest,
                         ::testing::Values(Case{ReduceMode::kAllReduce, 1, 2, true},
                                           Case{ReduceMode::kAllReduce, 1, 4, false},
                                           Case{ReduceMode::kReduceScatter, 1, 4, true},
                                           Case{ReduceMode::kReduceScatter, 1, 2, false},
                                           Case{ReduceMode::kHybrid, 2, 2, true},
                                           Case{ReduceMode::kHybrid, 2, 2, false}),
                         CaseName);

// Hybrid accumulation windows of two microbatches (reduce_scatter_only, then sync), one
// agreement per microbatch. mid_window: rank k runs 2k + 1 microbatches, so ranks run out after
// a reduce_scatter_only one and shadow the window's sync with the partial shard they hold;
// else 2k + 2 (whole windows), with the contributors' divide.
void RunWindows(bool mid_window) {
  constexpr int kWorld = 4;
  RunRanks(kWorld, [&](Group& world) {
    Mesh mesh = MakeMesh(world, 2, 2).value();
    ReducerConfig cfg;
    cfg.mode = ReduceMode::kHybrid;
    cfg.bucket_cap_bytes = cfg.first_bucket_cap_bytes = 48;
    cfg.timeout = absl::Seconds(30);
    auto r = GradientReducer::Create(Params(), {mesh.shard.get(), mesh.replica.get()}, cfg).value();
    JoinOptions jo;
    jo.divide_by_initial_world_size = mid_window;
    auto join = Join::Create(r.get(), jo).value();
    const int me = join->world_rank();
    auto micro = [&](int k) { return mid_window ? 2 * k + 1 : 2 * k + 2; };
    auto mode_of = [](int m) {
      return m % 2 == 0 ? SyncMode::kReduceScatterOnly : SyncMode::kSync;
    };
    int m = 0;
    for (; m < micro(me); ++m) {
      auto agreed = join->Agree(true, mode_of(m));
      ASSERT_TRUE(agreed.ok()) << agreed.status();
      ASSERT_OK(r->BeginBackward(mode_of(m)));
      for (int p = 4; p >= 0; --p) {
        TensorView v = r->GradView(ParamId(10 + p)).value();
        float* x = static_cast<float*>(v.data);
        for (size_t i = 0; i < v.count; ++i) x[i] = G(me, p, m, i);
        ASSERT_OK(r->MarkReady(ParamId(10 + p)));
      }
      ASSERT_OK(r->FinishBackward());
      if (mode_of(m) != SyncMode::kSync) continue;
      int active = 0;  // the window's contributors (the same in both microbatches here)
      for (int k = 0; k < kWorld; ++k) active += m < micro(k) ? 1 : 0;
      auto want = [&](int p, size_t i) {
        float sum = 0;
        for (int mb = m - 1; mb <= m; ++mb) {
          for (int k = 0; k < kWorld; ++k) sum += mb < micro(k) ? G(k, p, mb, i) : 0.0f;
        }
        return sum / static_cast<float>(mid_window ? kWorld : active);
      };
      CheckResults(*r, want, mid_window ? 0.0f : 1e-5f, m);
      ASSERT_OK(r->ZeroGrads());
    }
    auto last = join->RunJoined();
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_EQ(*last, me == kWorld - 1);
    EXPECT_EQ(join->AuthoritativeRank(*last).value(), kWorld - 1);
  });
}

TEST(JoinWindows, HybridReduceScatterOnlyRanksLeavingMidWindow) { RunWindows(true); }
TEST(JoinWindows, HybridReduceScatterOnlyWholeWindowsContributors) { RunWindows(false); }

TEST(JoinErrors, ThrowOnEarlyTerminationFailsEveryRank) {
  RunRanks(2, [](Group& world) {
    ReducerConfig cfg;
    cfg.timeout = absl::Seconds(30);
    auto r = GradientReducer::Create(Params(), {&world, nullptr}, cfg).value();
    JoinOptions jo;
    jo.throw_on_early_termination = true;
    auto join = Join::Create(r.get(), jo).value();
    ASSERT_EQ(join->Agree(true, SyncMode::kSync)->active, 2);  // even: nobody throws
    const bool has_data = world.rank() == 0;
    auto s = join->Agree(has_data, SyncMode::kSync);
    ExpectError(s.status(), absl::StatusCode::kOutOfRange,
                {has_data ? "Throwing across all ranks" : "Rank 1 exhausted all inputs",
                 "throw_on_early_termination"});
  });
}

TEST(JoinErrors, RanksThatDisagreeOnNoSyncAreNamed) {
  RunRanks(2, [](Group& world) {
    ReducerConfig cfg;
    cfg.timeout = absl::Seconds(30);
    auto r = GradientReducer::Create(Params(), {&world, nullptr}, cfg).value();
    auto join = Join::Create(r.get(), JoinOptions{}).value();
    auto s = join->Agree(true, world.rank() == 0 ? SyncMode::kSync : SyncMode::kNoSync);
    ExpectError(s.status(), absl::StatusCode::kInvalidArgument, {"1 sync", "1 no_sync"});
  });
}

TEST(JoinErrors, FullyShardedReducersAgreeButTheFrameworkShadows) {
  RunRanks(2, [](Group& world) {
    ReducerConfig cfg;
    cfg.mode = ReduceMode::kReduceScatter;
    cfg.shard_gradients = true;
    cfg.timeout = absl::Seconds(30);
    auto r = GradientReducer::Create(Params(), {&world, nullptr}, cfg).value();
    auto join = Join::Create(r.get(), JoinOptions{}).value();
    absl::StatusOr<JoinStep> s = join->Agree(world.rank() == 0, SyncMode::kSync);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(s->active, 1);
    if (world.rank() == 1) {  // its unit gathers cannot be replayed from the reducer
      ExpectError(join->Shadow(*s), absl::StatusCode::kUnimplemented,
                  {"shard_gradients", "zero gradient marks"});
    }
  });
}

}  // namespace
}  // namespace braid::sched
