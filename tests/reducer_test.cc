// GradientReducer on the local backend against the serial reference (tests/reducer_reference.h):
// every mode (all-reduce, reduce-scatter, hybrid) x dtype (f32, bf16, f16, mixed) x world/mesh
// shape x random readiness orders (different on every rank, marks from two threads) x microbatch
// schedules (no_sync, reduce_scatter_only, sync) x zero-copy views or the copy-in path, with odd
// parameter sizes that straddle shards and several buckets per dtype. Bit-exact: the local
// backend reduces in group-rank order, and the reference replays each stage in that order.
#include "scheduler/gradient_reducer.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "scheduler/divide.h"
#include "scheduler/mesh.h"
#include "tests/multirank.h"
#include "tests/reducer_reference.h"

namespace braid::sched {
namespace {

using braid::testing::RunRanks;
using reference::Scenario;

TEST(DivideRule, PreDivideFactorsAreFsdps) {
  EXPECT_EQ(PreDivideFactor(1), 1);
  EXPECT_EQ(PreDivideFactor(2), 2);
  EXPECT_EQ(PreDivideFactor(4), 2);
  EXPECT_EQ(PreDivideFactor(8), 4);
  EXPECT_EQ(PreDivideFactor(32), 8);
  EXPECT_EQ(PreDivideFactor(6), 2);  // FSDP says 4, which does not divide 6
  EXPECT_EQ(PreDivideFactor(3), 1);
  EXPECT_EQ(StepFor(DType::kF16, 6).post_divide, 3);
  EXPECT_EQ(StepFor(DType::kF16, 32).post_divide, 4);
  EXPECT_EQ(StepFor(DType::kBF16, 32).op.kind, ReduceKind::kAvg);
  EXPECT_EQ(StepFor(DType::kF32, 1).op.kind, ReduceKind::kSum);
}

// Gradient element i of parameter p on rank r in microbatch m of step s: any value in [-1, 1).
double Grad(int r, int p, int m, int s, size_t i) {
  uint64_t z = ((((static_cast<uint64_t>(r) * 131 + p) * 17 + m) * 7 + s) << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

class ReducerVsReference : public ::testing::TestWithParam<Scenario> {};

TEST_P(ReducerVsReference, BitExact) {
  const Scenario sc = GetParam();
  const int world = sc.replicas * sc.shards;
  RunRanks(world, [&](Group& g) {
    const int r = g.rank();
    Mesh mesh;
    ReducerGroups groups{&g, nullptr};
    if (sc.mode == ReduceMode::kHybrid) {
      auto m = MakeMesh(g, sc.replicas, sc.shards);
      ASSERT_TRUE(m.ok()) << m.status();
      mesh = std::move(*m);
      groups = {mesh.shard.get(), mesh.replica.get()};
    }
    ReducerConfig cfg;
    cfg.mode = sc.mode;
    cfg.first_bucket_cap_bytes = 256;  // several buckets per dtype
    cfg.bucket_cap_bytes = 4096;
    cfg.timeout = absl::Seconds(60);
    cfg.gradient_as_bucket_view = !sc.copy_in;
    if (sc.reduce_f32) cfg.reduce_dtype = DType::kF32;
    const auto params = reference::MakeParams(sc.dtypes);
    auto reducer = GradientReducer::Create(params, groups, cfg);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    GradientReducer& red = **reducer;
    // Copy-in path: the framework's own gradient buffers.
    std::vector<std::vector<char>> own(params.size());
    for (size_t p = 0; p < params.size(); ++p) {
      own[p].assign(params[p].count * DTypeSize(params[p].dtype), 0);
      if (sc.copy_in) ASSERT_OK(red.SetGradBuffer(params[p].id, own[p].data()));
    }
    auto grad_of = [&](int p) -> TensorView {
      if (sc.copy_in) return TensorView{own[p].data(), params[p].count, params[p].dtype, params[p].device};
      return *red.GradView(params[p].id);
    };
    std::mt19937 order_rng(1234 + 77 * r);
    const int mbs = static_cast<int>(std::strlen(sc.schedule));
    for (int step = 0; step < 2; ++step) {
      red.ZeroGrads();
      for (auto& o : own) std::fill(o.begin(), o.end(), 0);  // the framework's zero_grad
      for (int m = 0; m < mbs; ++m) {
        ASSERT_OK(red.BeginBackward(reference::SyncModeOf(sc.schedule[m])));
        std::vector<int> order(params.size());
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), order_rng);  // a different order on every rank
        // Marks come from two threads, as autograd's may.
        auto mark_range = [&](size_t from, size_t to) {
          for (size_t k = from; k < to; ++k) {
            const int p = order[k];
            reference::Accumulate(grad_of(p), Grad, r, p, m, step);
            ASSERT_OK(red.MarkReady(params[p].id));
          }
        };
        std::thread other([&] { mark_range(order.size() / 2, order.size()); });
        mark_range(0, order.size() / 2);
        other.join();
        ASSERT_OK(red.FinishBackward());
      }
      ASSERT_OK(reference::CheckStep(sc, red, r, step, Grad, &own));
    }
  });
}

std::vector<Scenario> AllScenarios() {
  std::vector<Scenario> out;
  for (int dt = 0; dt < 4; ++dt) {
    for (const char* sched : {"S", "NNS"}) {
      for (int w : {1, 2, 4, 8}) {
        out.push_back({ReduceMode::kAllReduce, 1, w, dt, sched});
        out.push_back({ReduceMode::kReduceScatter, 1, w, dt, sched});
      }
    }
    for (const char* sched : {"S", "NNS", "RRS", "NRNS", "RNRS"}) {
      out.push_back({ReduceMode::kHybrid, 2, 2, dt, sched});
      out.push_back({ReduceMode::kHybrid, 2, 4, dt, sched});
    }
    if (dt != 0) {  // half gradients reduced in f32
      for (const char* sched : {"S", "NNS"}) {
        out.push_back({ReduceMode::kAllReduce, 1, 4, dt, sched, false, true});
        out.push_back({ReduceMode::kReduceScatter, 1, 3, dt, sched, true, true});
      }
      for (const char* sched : {"S", "RRS", "NRNS"}) out.push_back({ReduceMode::kHybrid, 2, 2, dt, sched, false, true});
    }
    for (const char* sched : {"S", "NNS"}) {  // copy-in path
      out.push_back({ReduceMode::kAllReduce, 1, 3, dt, sched, true});
      out.push_back({ReduceMode::kReduceScatter, 1, 4, dt, sched, true});
      out.push_back({ReduceMode::kHybrid, 2, 2, dt, sched, true});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, ReducerVsReference, ::testing::ValuesIn(AllScenarios()),
                         [](const ::testing::TestParamInfo<Scenario>& i) {
                           return reference::ScenarioName(i.param);
                         });

}  // namespace
}  // namespace braid::sched
