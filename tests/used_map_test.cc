// The reducer's used-map agreement (scheduler/used_map.h) on the `local` backend: every rank
// uses a random subset of the parameters in each microbatch and marks them in a random order;
// the agreed map must be the OR over ranks and microbatches of the window, and every gradient
// the serial reference's average (a parameter used on some ranks only reduced with zeros from
// the others), in all three modes, with the agreement at FinishBackward or declared up front.
#include <algorithm>
#include <cstring>
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

constexpr int kWorld = 4;
constexpr int kParams = 6;
constexpr size_t kSizes[kParams] = {5, 9, 3, 12, 7, 4};

std::vector<ParamSpec> Params() {
  std::vector<ParamSpec> ps;
  for (int i = 0; i < kParams; ++i) {
    ps.push_back(ParamSpec{10 + i, kSizes[i], DType::kF32, Device::Cpu(),
                           absl::StrCat("layer", i, ".weight")});
  }
  return ps;
}

// Integer-valued, so every sum and every divide by a power of two is exact.
float Grad(int rank, int p, int step, int mb, size_t e) {
  return static_cast<float>((rank + 1) * static_cast<int>(e % 5 + 1) + 3 * step + mb + p);
}

// Rank r's used flags in microbatch mb of step `step` (identical on every rank that asks).
std::vector<bool> UsedBy(int r, int step, int mb) {
  std::mt19937 rng(1000 * step + 100 * mb + r);
  std::vector<bool> used(kParams);
  for (int p = 0; p < kParams; ++p) used[p] = rng() % 3 != 0;
  if (step == 2) used[0] = false;           // no rank uses parameter 0 in step 2
  if (step == 2 && r == 1) used[5] = true;  // one rank only
  if (step == 2 && r != 1) used[5] = false;
  return used;
}

struct Case {
  ReduceMode mode;
  UnusedAgreement agree;
  const char* window;  // the microbatches of one step: N no_sync, R reduce_scatter_only, S sync
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(c.mode == ReduceMode::kAllReduce       ? "allreduce"
                      : c.mode == ReduceMode::kReduceScatter ? "reduce_scatter"
                                                             : "hybrid",
                      c.agree == UnusedAgreement::kDeclared ? "_declared_" : "_at_finish_",
                      c.window);
}

class UsedMapTest : public ::testing::TestWithParam<Case> {};

void RunCase(Group& world, const Case& c, bool static_graph) {
  Mesh mesh;
  ReducerGroups groups{&world, nullptr};
  if (c.mode == ReduceMode::kHybrid) {
    auto m = MakeMesh(world, 2, 2);
    ASSERT_TRUE(m.ok()) << m.status();
    mesh = *std::move(m);
    groups = {mesh.shard.get(), mesh.replica.get()};
  }
  ReducerConfig cfg;
  cfg.mode = c.mode;
  cfg.bucket_cap_bytes = 64;
  cfg.first_bucket_cap_bytes = 32;
  cfg.agree_unused = c.agree;
  cfg.static_graph = static_graph;
  cfg.timeout = absl::Seconds(30);
  auto created = GradientReducer::Create(Params(), groups, cfg);
  ASSERT_TRUE(created.ok()) << created.status();
  GradientReducer& red = **created;
  const BucketPlan& plan = red.plan();
  const int rank = world.rank();
  const int n_mb = static_cast<int>(strlen(c.window));
  std::vector<bool> first_map;
  for (int step = 0; step < 4; ++step) {
    std::mt19937 order_rng(77 * step + rank);
    for (int mb = 0; mb < n_mb; ++mb) {
      const SyncMode sm = c.window[mb] == 'N'   ? SyncMode::kNoSync
                          : c.window[mb] == 'R' ? SyncMode::kReduceScatterOnly
                                                : SyncMode::kSync;
      const std::vector<bool> used = UsedBy(rank, step, mb);
      ASSERT_OK(red.BeginBackward(sm));
      std::vector<int> order;
      std::vector<ParamId> unused;
      for (int p = 0; p < kParams; ++p) {
        if (used[p]) {
          order.push_back(p);
        } else {
          unused.push_back(10 + p);
        }
      }
      if (c.agree == UnusedAgreement::kDeclared) ASSERT_OK(red.DeclareUnused(unused));
      std::shuffle(order.begin(), order.end(), order_rng);
      for (int p : order) {
        absl::StatusOr<TensorView> v = red.GradView(10 + p);
        ASSERT_TRUE(v.ok()) << v.status();
        float* g = static_cast<float*>(v->data);
        for (size_t e = 0; e < kSizes[p]; ++e) g[e] += Grad(rank, p, step, mb, e);
        ASSERT_OK(red.MarkReady(10 + p));
      }
      ASSERT_OK(red.FinishBackward());
    }
    // The serial reference: the window's sums averaged over the world, and the OR of use.
    std::vector<std::vector<float>> want(kParams);
    std::vector<bool> want_used(kParams, false);
    for (int p = 0; p < kParams; ++p) {
      want[p].assign(kSizes[p], 0.0f);
      for (int r = 0; r < kWorld; ++r) {
        for (int mb = 0; mb < n_mb; ++mb) {
          if (!UsedBy(r, step, mb)[p]) continue;
          want_used[p] = true;
          for (size_t e = 0; e < kSizes[p]; ++e) want[p][e] += Grad(r, p, step, mb, e);
        }
      }
      for (float& x : want[p]) x /= kWorld;
    }
    if (step == 0) first_map = want_used;
    ASSERT_TRUE(red.used_map().work()->Done());
    EXPECT_OK(red.used_map().work()->Wait(absl::ZeroDuration()));
    for (int p = 0; p < kParams; ++p) {
      absl::StatusOr<bool> u = red.Used(10 + p);
      ASSERT_TRUE(u.ok()) << u.status();
      EXPECT_EQ(*u, static_graph ? first_map[p] : want_used[p])
          << "step " << step << " param " << p << " rank " << rank;
    }
    for (size_t b = 0; b < plan.buckets().size(); ++b) {
      const Bucket& bk = plan.buckets()[b];
      std::vector<float> full(bk.padded_count, 0.0f);
      for (int i : bk.params) {
        const int p = static_cast<int>(plan.params()[i].id) - 10;
        std::copy(want[p].begin(), want[p].end(), full.begin() + plan.slot(i).offset);
      }
      if (c.mode == ReduceMode::kAllReduce) {
        for (int i : bk.params) {
          const int p = static_cast<int>(plan.params()[i].id) - 10;
          const float* g = static_cast<const float*>(red.GradView(10 + p)->data);
          for (size_t e = 0; e < kSizes[p]; ++e) {
            ASSERT_EQ(g[e], want[p][e]) << "step " << step << " param " << p << " e " << e;
          }
        }
      } else {
        const size_t lo = static_cast<size_t>(groups.shard->rank()) * bk.shard_count;
        const float* s = static_cast<const float*>(red.ShardView(static_cast<int>(b)).data);
        for (size_t k = 0; k < bk.shard_count; ++k) {
          ASSERT_EQ(s[k], full[lo + k]) << "step " << step << " bucket " << b << " k " << k;
        }
      }
    }
    ASSERT_OK(red.ZeroGrads());
  }
}

TEST_P(UsedMapTest, AgreedMapAndGradientsMatchTheSerialReference) {
  RunRanks(kWorld, [&](Group& world) { RunCase(world, GetParam(), false); });
}

INSTANTIATE_TEST_SUITE_P(
    Modes, UsedMapTest,
    ::testing::Values(Case{ReduceMode::kAllReduce, UnusedAgreement::kAtFinish, "S"},
                      Case{ReduceMode::kAllReduce, UnusedAgreement::kDeclared, "NS"},
                      Case{ReduceMode::kReduceScatter, UnusedAgreement::kAtFinish, "NS"},
                      Case{ReduceMode::kReduceScatter, UnusedAgreement::kDeclared, "S"},
                      Case{ReduceMode::kHybrid, UnusedAgreement::kAtFinish, "RS"},
                      Case{ReduceMode::kHybrid, UnusedAgreement::kDeclared, "RRS"}),
    Name);

TEST(UsedMap, StaticGraphKeepsTheFirstStepsMap) {
  RunRanks(kWorld, [](Group& world) {
    RunCase(world, Case{ReduceMode::kReduceScatter, UnusedAgreement::kDeclared, "S"}, true);
  });
}

TEST(UsedMap, DeclarationErrorsNameTheParameter) {
  RunRanks(2, [](Group& world) {
    ReducerConfig cfg;
    cfg.agree_unused = UnusedAgreement::kDeclared;
    auto red = GradientReducer::Create(Params(), {&world, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    GradientReducer& r = **red;
    ASSERT_OK(r.BeginBackward(SyncMode::kSync));
    ExpectError(r.MarkReady(11), absl::StatusCode::kFailedPrecondition,
                {"'layer1.weight' (id 11)", "before DeclareUnused"});
    ExpectError(r.DeclareUnused({10, 10}), absl::StatusCode::kInvalidArgument,
                {"layer0.weight", "twice"});
    ExpectError(r.DeclareUnused({99}), absl::StatusCode::kNotFound, {"99"});
    ASSERT_OK(r.DeclareUnused({10}));
    ExpectError(r.MarkReady(10), absl::StatusCode::kFailedPrecondition,
                {"'layer0.weight' (id 10)", "already marked"});
    for (int p = 1; p < kParams; ++p) ASSERT_OK(r.MarkReady(10 + p));
    ASSERT_OK(r.FinishBackward());
    EXPECT_FALSE(*r.Used(10));
    EXPECT_TRUE(*r.Used(11));

    ReducerConfig plain;  // without agree_unused
    auto other = GradientReducer::Create(Params(), {&world, nullptr}, plain);
    ASSERT_TRUE(other.ok()) << other.status();
    ASSERT_OK((*other)->BeginBackward(SyncMode::kSync));
    ExpectError((*other)->DeclareUnused({10}), absl::StatusCode::kFailedPrecondition,
                {"agree_unused"});
    for (int p = 0; p < kParams; ++p) ASSERT_OK((*other)->MarkReady(10 + p));
    ASSERT_OK((*other)->FinishBackward());
    EXPECT_TRUE(*(*other)->Used(10));  // no agreement: every parameter counts as used
  });
}

}  // namespace
}  // namespace braid::sched
