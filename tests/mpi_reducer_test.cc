// GradientReducer over the `mpi` backend under mpirun (tests/run_mpi.sh, 2 and 4 processes):
// the backend-independent part of tests/reducer_test.cc and tests/reducer_errors_test.cc.
//  - all-reduce and reduce-scatter on the world, hybrid on a 2x2 mesh (4 processes only), for
//    f32, bf16, f16 and mixed-dtype parameter sets, with accumulation schedules of no_sync (N),
//    reduce_scatter_only (R, hybrid) and sync (S) microbatches, readiness orders that differ
//    on every rank and marks from two threads, checked bit for bit against the serial
//    reference of tests/reducer_reference.h;
//  - misuse (a mark outside a backward, an unknown id, a second mark), unused parameters
//    reported by name or zero-filled when allowed, and a plan that differs on one rank failing
//    Create on every rank, naming the parameter.
//
// Every process runs the same tests in the same order (do not shuffle or filter differently
// per rank): the rank-order contract applies to the test itself. Each reducer and the backend
// have a 60 s deadline and run_mpi.sh a wall-clock limit, so a rank that fails an assertion
// and skips a collective makes its peers fail, not hang.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "comm/backend.h"
#include "comm/mesh.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "tests/mpi_world.h"
#include "tests/multirank.h"
#include "tests/partition_checks.h"
#include "tests/reducer_reference.h"
#include "tests/reducer_unused_checks.h"
#include "tests/used_map_checks.h"

namespace braid::sched {
namespace {

using reference::Scenario;

constexpr absl::Duration kTimeout = absl::Seconds(60);

// The world group, created once in main() (before InitGoogleTest: the scenario list below
// depends on its size).
Group* the_world = nullptr;
Group& World() { return *the_world; }

// ---- exact gradients ------------------------------------------------------------------------
// MPI picks its own reduction order (and Open MPI's algorithms differ with the process
// count), while the reference sums in group-rank order. The comparison stays bit-exact because
// no operation anywhere rounds:
//  - every gradient element is k/8 with an integer |k| <= 8;
//  - every value any rank or MPI ever forms (a microbatch sum in the gradient dtype, the f32
//    staging of a half-precision reduction, a partial sum in any order, the reduce_scatter_only
//    partial, the replica all-reduce) is a sum of a subset of the world x microbatches terms
//    (at most 4 x 4 = 16 of them, so |sum of k| <= 128 < 2^8), times a power of two: the f16
//    pre-divide (1/2 for groups of 2 and 4), the average (1/2 or 1/4) and the f16 post-divide
//    (1/2 for a group of 4) are all powers of two because the groups have 1, 2 or 4 ranks;
//  - so every value is K * 2^-j with an integer |K| <= 128 and 3 <= j <= 5 (the deepest: an
//    f16 average over 4 ranks, 2^-3 * 1/2 before the sum * 1/2 after it, or over a 2x2 mesh):
//    K's 8 significant bits fit bf16's 8-bit significand (f16 has 11, f32 24), and 2^-5 is far
//    above f16's smallest normal (2^-14). Sums, scalings and narrowings are all exact, and
//    exact arithmetic does not depend on the order.
// A group size that is not a power of two (an average over 3 ranks) would break this.
double ExactGrad(int r, int p, int m, int s, size_t i) {
  uint64_t z =
      ((((static_cast<uint64_t>(r) * 131 + p) * 17 + m) * 7 + s) << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (static_cast<int>(z % 17) - 8) / 8.0;
}

// ---- against the serial reference ------------------------------------------------------------
class MpiReducerVsReference : public ::testing::TestWithParam<Scenario> {};

TEST_P(MpiReducerVsReference, BitExact) {
  EXPECT_OK(reference::RunScenario(World(), GetParam(), ExactGrad, kTimeout));
}

// The scenarios for the world's size. gtest (1.10 on) evaluates a suite's generator when
// InitGoogleTest registers the parameterized tests, which main() calls after creating the
// world. At most 4 microbatches: the exactness bound above counts 4 ranks x 4 microbatches.
std::vector<Scenario> ScenariosForWorld() {
  const int n = the_world != nullptr ? the_world->size() : 1;
  std::vector<Scenario> out;
  for (int dt = 0; dt < 4; ++dt) {
    for (const char* sched : {"S", "NNS", "NNNS"}) {
      out.push_back({ReduceMode::kAllReduce, 1, n, dt, sched});
      out.push_back({ReduceMode::kReduceScatter, 1, n, dt, sched});
    }
    if (n == 4) {
      for (const char* sched : {"S", "NNS", "RRS", "NRNS", "RNRS"}) {
        out.push_back({ReduceMode::kHybrid, 2, 2, dt, sched});
      }
    }
  }
  // Through an OpScheduler with small credits: every bucket over it is reduced in partitions.
  for (size_t credit : {size_t{256}, size_t{1024}}) {
    for (int dt = 0; dt < 4; ++dt) {
      for (const char* sched : {"S", "NNS"}) {
        out.push_back({ReduceMode::kAllReduce, 1, n, dt, sched});
        out.back().credit = credit;
        out.push_back({ReduceMode::kReduceScatter, 1, n, dt, sched});
        out.back().credit = credit;
      }
      if (n == 4) {
        out.push_back({ReduceMode::kHybrid, 2, 2, dt, "RRS"});
        out.back().credit = credit;
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(World, MpiReducerVsReference, ::testing::ValuesIn(ScenariosForWorld()),
                         [](const ::testing::TestParamInfo<Scenario>& i) {
                           return reference::ScenarioName(i.param);
                         });

// ---- partitions on non-exact gradients ---------------------------------------------------------
// Partitioned against unpartitioned, byte for byte, with gradients whose sums round: MPI's own
// per-element order must not depend on the call's size. At 2 processes any order is a + b.
TEST(MpiPartitions, MatchUnpartitionedOnNoise) {
  std::vector<ReduceMode> modes = {ReduceMode::kAllReduce, ReduceMode::kReduceScatter};
  if (World().size() % 2 == 0 && World().size() >= 4) modes.push_back(ReduceMode::kHybrid);
  for (ReduceMode mode : modes) {
    for (int dtypes : {0, 1, 2, 3}) {
      SCOPED_TRACE(absl::StrCat("mode ", static_cast<int>(mode), " dtypes ", dtypes));
      EXPECT_OK(testing::CheckPartitionedMatchesUnpartitioned(World(), mode, dtypes, 256, false,
                                                              kTimeout));
    }
  }
}

// The used-map agreement (find_unused) with random per-rank use and readiness orders, against the
// serial reference (tests/used_map_checks.h); hybrid on a 2 x n/2 mesh.
TEST(MpiUsedMap, AgreedMapAndGradientsMatchTheSerialReference) {
  using testing::UsedMapCase;
  std::vector<UsedMapCase> cases = {{ReduceMode::kAllReduce, UnusedAgreement::kDeclared, "NS"},
                                    {ReduceMode::kReduceScatter, UnusedAgreement::kAtFinish, "S"}};
  if (World().size() % 2 == 0 && World().size() >= 4) {
    cases.push_back({ReduceMode::kHybrid, UnusedAgreement::kDeclared, "RS"});
  }
  for (const UsedMapCase& c : cases) {
    SCOPED_TRACE(testing::UsedMapCaseName(c));
    testing::CheckUsedMapAgainstReference(World(), c, false);
  }
}

// ---- errors (as in tests/reducer_errors_test.cc, on the mpi world) ----------------------------
using braid::testing::ExpectError;
using testing::TwoParams;

ReducerConfig TestConfig() {
  ReducerConfig cfg;
  cfg.timeout = kTimeout;
  return cfg;
}

TEST(MpiReducerErrors, MarksOutsideBackwardUnknownAndTwice) {
  auto red = GradientReducer::Create(TwoParams(), {&World(), nullptr}, TestConfig());
  ASSERT_TRUE(red.ok()) << red.status();
  ExpectError((*red)->MarkReady(1), absl::StatusCode::kFailedPrecondition,
              {"'fc.weight' (id 1)", "outside a backward"});
  ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
  ExpectError((*red)->MarkReady(99), absl::StatusCode::kNotFound, {"id 99"});
  ASSERT_OK((*red)->MarkReady(2));
  ExpectError((*red)->MarkReady(2), absl::StatusCode::kFailedPrecondition,
              {"'fc.bias' (id 2)", "already marked"});
  ASSERT_OK((*red)->MarkReady(1));
  // The refused marks changed nothing: the backward completes on every rank.
  ASSERT_OK((*red)->FinishBackward());
}

TEST(MpiReducerErrors, PlanThatDiffersOnOneRankFailsCreateEverywhere) {
  Group& g = World();
  const int odd_rank = g.size() - 1;
  auto params = TwoParams();
  if (g.rank() == odd_rank) params[0].count = 9;
  ExpectError(GradientReducer::Create(params, {&g, nullptr}, TestConfig()).status(),
              absl::StatusCode::kFailedPrecondition,
              {"'fc.weight'", absl::StrCat("rank ", odd_rank)});
  // Every rank took part in the same checks, so the world is still in step.
  auto red = GradientReducer::Create(TwoParams(), {&g, nullptr}, TestConfig());
  EXPECT_TRUE(red.ok()) << red.status();
}

TEST(MpiReducerUnused, ReportedByNameUnlessAllowed) {
  testing::CheckUnusedReportedByName(World(), TestConfig());
}

TEST(MpiReducerUnused, ZeroFilledAndReducedWhenAllowedButNoSyncSumsAreKept) {
  testing::CheckUnusedZeroFilledButNoSyncSumsKept(World(), TestConfig());
}

}  // namespace
}  // namespace braid::sched

int main(int argc, char** argv) {
  // The parameterized suites call ScenariosForWorld() at InitGoogleTest, once the world exists.
  return braid::testing::RunTestsOnMpiWorld(argc, argv, braid::sched::kTimeout,
                                            &braid::sched::the_world);
}
