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
  RunRanks(sc.replicas * sc.shards, [&](Group& g) {
    EXPECT_OK(reference::RunScenario(g, sc, Grad, absl::Seconds(60)));
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
