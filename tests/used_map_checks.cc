#include "tests/used_map_checks.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/mesh.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"

namespace braid::sched::testing {
namespace {

constexpr int kParams = 6;
constexpr size_t kSizes[kParams] = {5, 9, 3, 12, 7, 4};

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

}  // namespace

std::vector<ParamSpec> UsedMapParams() {
  std::vector<ParamSpec> ps;
  for (int i = 0; i < kParams; ++i) {
    ps.push_back(ParamSpec{10 + i, kSizes[i], DType::kF32, Device::Cpu(),
                           absl::StrCat("layer", i, ".weight")});
  }
  return ps;
}

std::string UsedMapCaseName(const UsedMapCase& c) {
  return absl::StrCat(c.mode == ReduceMode::kAllReduce       ? "allreduce"
                      : c.mode == ReduceMode::kReduceScatter ? "reduce_scatter"
                                                             : "hybrid",
                      c.agree == UnusedAgreement::kDeclared           ? "_declared_"
                      : c.agree == UnusedAgreement::kDeclaredAtFinish ? "_declared_at_finish_"
                                                                      : "_at_finish_",
                      c.window);
}

void CheckUsedMapAgainstReference(Group& world, const UsedMapCase& c, bool static_graph) {
  Mesh mesh;
  ReducerGroups groups{&world, nullptr};
  if (c.mode == ReduceMode::kHybrid) {
    auto m = MakeMesh(world, 2, world.size() / 2);
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
  auto created = GradientReducer::Create(UsedMapParams(), groups, cfg);
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
      // kDeclaredAtFinish: only every other unused parameter is declared; the rest are
      // neither declared nor marked (torch's reached-but-no-gradient) and count as unused.
      if (c.agree == UnusedAgreement::kDeclaredAtFinish) {
        std::vector<ParamId> some;
        for (size_t k = 0; k < unused.size(); k += 2) some.push_back(unused[k]);
        unused = some;
      }
      if (Declares(c.agree)) ASSERT_OK(red.DeclareUnused(unused));
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
      for (int r = 0; r < world.size(); ++r) {
        for (int mb = 0; mb < n_mb; ++mb) {
          if (!UsedBy(r, step, mb)[p]) continue;
          want_used[p] = true;
          for (size_t e = 0; e < kSizes[p]; ++e) want[p][e] += Grad(r, p, step, mb, e);
        }
      }
      for (float& x : want[p]) x /= static_cast<float>(world.size());
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

}  // namespace braid::sched::testing
