// TrainingStack (optim/training_stack.h) on the `local` backend: the stack it assembles steps
// bit for bit like the hand-wired reducer + gatherer + optimizer of tests/optim/optimizer_harness
// and like the serial reference, in reduce-scatter and hybrid mode; its re-plans (a new cap,
// DDP's rebuild, the autotuner's trials) keep every result; the fully sharded side (units,
// shard-only gradients, one pool) matches the reference at every forward; misuse is refused.
#include "optim/training_stack.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "tests/multirank.h"
#include "tests/optim/optimizer_harness.h"

namespace braid::optim::testing {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

// The stack a test builds: its groups (a mesh in hybrid mode) and the stack over them.
struct Built {
  Mesh mesh;
  std::unique_ptr<TrainingStack> stack;
};

std::vector<sched::ParamSpec> Specs(const OptScenario& s, int units) {
  std::vector<sched::ParamSpec> specs;
  for (size_t i = 0; i < s.counts.size(); ++i) {
    sched::ParamSpec p{static_cast<sched::ParamId>(i), s.counts[i], s.dtype, Device::Cpu(),
                       absl::StrCat("p", i)};
    if (units > 0) p.unit = static_cast<int>(i) * units / static_cast<int>(s.counts.size());
    specs.push_back(p);
  }
  return specs;
}

// The harness's stack (BuildStack) through the assembler: same caps, modes, deadlines.
absl::StatusOr<Built> Build(Group& world, const OptScenario& s, bool rebuild_order = false) {
  Built b;
  StackOptions so;
  so.reducer.bucket_cap_bytes = s.bucket_cap_bytes;
  so.reducer.first_bucket_cap_bytes = s.bucket_cap_bytes / 2;
  so.reducer.timeout = absl::Seconds(60);
  so.reducer.rebuild_bucket_order = rebuild_order;
  sched::ReducerGroups groups{&world, nullptr};
  so.reducer.mode = sched::ReduceMode::kReduceScatter;
  if (s.replicas > 1) {
    ASSIGN_OR_RETURN(b.mesh, MakeMesh(world, s.replicas, s.shards));
    so.reducer.mode = sched::ReduceMode::kHybrid;
    groups = {b.mesh.shard.get(), b.mesh.replica.get()};
  }
  ASSIGN_OR_RETURN(b.stack, TrainingStack::Create(Specs(s, 0), groups, so));
  ParamOptions po;
  po.optimizer = s.opt;
  po.optimizer->timeout = absl::Seconds(60);
  po.timeout = absl::Seconds(60);
  RETURN_IF_ERROR(b.stack->AddParamSide(po));
  for (size_t i = 0; i < s.counts.size(); ++i) {
    std::vector<uint8_t> init(s.counts[i] * DTypeSize(s.dtype));
    for (size_t j = 0; j < s.counts[i]; ++j)
      StoreElement(init.data(), s.dtype, j, InitialValue(static_cast<int>(i), j));
    RETURN_IF_ERROR(b.stack->optimizer()->SetParam(static_cast<sched::ParamId>(i), init.data()));
  }
  RETURN_IF_ERROR(b.stack->optimizer()->WaitAllParams());
  return b;
}

// Step t of `s` through the stack's backward (the harness's gradients and readiness orders).
absl::Status StackStep(TrainingStack& st, const OptScenario& s, int t, int rank) {
  const int P = static_cast<int>(s.counts.size());
  for (int u = 0; u < static_cast<int>(s.schedule.size()); ++u) {
    RETURN_IF_ERROR(st.BeginBackward(s.schedule[u]));
    std::vector<int> order(P);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(rank * 1000 + t * 10 + u));
    for (int i : order) {
      ASSIGN_OR_RETURN(TensorView g, st.reducer().GradView(i));
      for (size_t j = 0; j < g.count; ++j)
        StoreElement(
            g.data, s.dtype, j,
            static_cast<float>(LoadElement(g.data, s.dtype, j)) + Grad(rank, t, u, i, j, s));
      RETURN_IF_ERROR(st.reducer().MarkReady(i));
    }
    RETURN_IF_ERROR(st.FinishBackward());
  }
  return st.optimizer()->WaitAllParams();
}

// Every parameter as the stack's gatherer holds it, against `want`; the error names the first
// parameter that differs.
absl::Status Compare(TrainingStack& st, const OptScenario& s,
                     const std::vector<std::vector<uint8_t>>& want, const std::string& what) {
  for (size_t i = 0; i < s.counts.size(); ++i) {
    ASSIGN_OR_RETURN(TensorView v, st.gatherer()->ParamView(static_cast<sched::ParamId>(i)));
    if (std::memcmp(v.data, want[i].data(), want[i].size()) != 0)
      return absl::InternalError(absl::StrCat("parameter ", i, " differs from ", what));
  }
  return absl::OkStatus();
}

class StackVsHandWired : public ::testing::TestWithParam<int> {};  // replicas (x 2 shards)

TEST_P(StackVsHandWired, StepsBitForBit) {
  const OptScenario s = TwoGroupScenario(GetParam(), 2);
  RunRanks(GetParam() * 2, [&](Group& world) {
    absl::StatusOr<std::unique_ptr<RankStack>> hand = BuildStack(world, s);
    ASSERT_TRUE(hand.ok()) << hand.status();
    absl::StatusOr<Built> built = Build(world, s);
    ASSERT_TRUE(built.ok()) << built.status();
    TrainingStack& st = *built->stack;
    EXPECT_EQ(st.reducer().plan().buckets().size(), (*hand)->reducer->plan().buckets().size());
    for (int t = 0; t < s.steps; ++t) {
      ASSERT_OK(RunSteps(**hand, s, t, t + 1));
      ASSERT_OK(StackStep(st, s, t, world.rank()));
      absl::StatusOr<std::vector<std::vector<uint8_t>>> hand_params = Params(**hand, s);
      ASSERT_TRUE(hand_params.ok()) << hand_params.status();
      EXPECT_OK(Compare(st, s, *hand_params, absl::StrCat("the hand-wired stack's, step ", t)));
      EXPECT_OK(Compare(st, s, ReferenceParams(s, t + 1), absl::StrCat("the reference, step ", t)));
    }
    EXPECT_EQ(st.optimizer()->last_step().rounds, s.steps);
  });
}

INSTANTIATE_TEST_SUITE_P(Modes, StackVsHandWired, ::testing::Values(1, 2), [](const auto& info) {
  return info.param == 1 ? "ReduceScatter" : "Hybrid2x2";
});

TEST(TrainingStack, ReplanAndRebuildKeepResults) {
  OptScenario s = TwoGroupScenario(1, 2);
  s.steps = 6;
  RunRanks(2, [&](Group& world) {
    absl::StatusOr<Built> built = Build(world, s, /*rebuild_order=*/true);
    ASSERT_TRUE(built.ok()) << built.status();
    TrainingStack& st = *built->stack;
    const size_t buckets = st.reducer().plan().buckets().size();
    for (int t = 0; t < s.steps; ++t) {
      if (t == 2) {  // the first synced backward's order: rank 0's (random) order is adopted
        absl::StatusOr<bool> rebuilt = st.RebuildBuckets();
        ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
        EXPECT_TRUE(*rebuilt);
      }
      if (t == 4) {
        absl::StatusOr<bool> moved = st.Replan(s.bucket_cap_bytes / 4, s.bucket_cap_bytes / 8);
        ASSERT_TRUE(moved.ok()) << moved.status();
        EXPECT_TRUE(*moved);
        EXPECT_GT(st.reducer().plan().buckets().size(), buckets);
      }
      ASSERT_OK(StackStep(st, s, t, world.rank()));
      EXPECT_OK(Compare(st, s, ReferenceParams(s, t + 1), absl::StrCat("the reference, step ", t)));
    }
  });
}

// Replan answers whether the buckets changed: caps giving the same buckets rebuild nothing
// (the gatherer is the same object; a rebuild retires it and makes another), and the steps
// after still match the reference.
TEST(TrainingStack, ReplanReportsWhetherBucketsChanged) {
  OptScenario s = TwoGroupScenario(1, 2);
  s.steps = 3;
  RunRanks(2, [&](Group& world) {
    absl::StatusOr<Built> built = Build(world, s);
    ASSERT_TRUE(built.ok()) << built.status();
    TrainingStack& st = *built->stack;
    ASSERT_GT(st.reducer().plan().buckets().size(), 1u);
    ASSERT_OK(StackStep(st, s, 0, world.rank()));
    const size_t one = size_t{1} << 30;  // every parameter in one bucket
    const sched::ParamGatherer* before = st.gatherer();
    absl::StatusOr<bool> moved = st.Replan(one, one);
    ASSERT_TRUE(moved.ok()) << moved.status();
    EXPECT_TRUE(*moved);
    EXPECT_EQ(st.reducer().plan().buckets().size(), 1u);
    EXPECT_NE(st.gatherer(), before);
    ASSERT_OK(StackStep(st, s, 1, world.rank()));
    EXPECT_OK(Compare(st, s, ReferenceParams(s, 2), "the reference, step 1"));
    before = st.gatherer();
    for (size_t cap : {one, 2 * one}) {  // the same caps; caps that give the same bucket
      absl::StatusOr<bool> again = st.Replan(cap, cap);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_FALSE(*again) << cap;
      EXPECT_EQ(st.gatherer(), before) << cap;
    }
    EXPECT_EQ(st.reducer().config().bucket_cap_bytes, 2 * one);
    ASSERT_OK(StackStep(st, s, 2, world.rank()));
    EXPECT_OK(Compare(st, s, ReferenceParams(s, 3), "the reference, step 2"));
  });
}

TEST(TrainingStack, AutotuneAdoptsAndKeepsResults) {
  OptScenario s = TwoGroupScenario(1, 2);
  s.steps = 100;  // the tuner needs about 50 (successive halving over 5 candidates)
  RunRanks(2, [&](Group& world) {
    absl::StatusOr<Built> built = Build(world, s);
    ASSERT_TRUE(built.ok()) << built.status();
    TrainingStack& st = *built->stack;
    // Candidate 3 (half the cap) is made to look fastest. By index: caps that give the same
    // buckets leave the plan (and its options) as they were.
    const size_t fast = s.bucket_cap_bytes / 2;
    int replans = 0, t = 0;
    for (bool done = false; !done && t < s.steps; ++t) {
      ASSERT_OK(StackStep(st, s, t, world.rank()));
      EXPECT_OK(Compare(st, s, ReferenceParams(s, t + 1), absl::StrCat("the reference, step ", t)));
      const bool is_fast = st.tuner() != nullptr && st.tuner()->current_index() == 3;
      absl::StatusOr<TrainingStack::TuneStep> r = st.Autotune(absl::Milliseconds(is_fast ? 5 : 9));
      ASSERT_TRUE(r.ok()) << r.status();
      replans += r->replanned;
      done = r->done;
    }
    EXPECT_LT(t, s.steps) << "the tuner did not finish";
    EXPECT_GT(replans, 0);
    ASSERT_NE(st.tuner(), nullptr);
    EXPECT_EQ(st.tuner()->winner(), 3) << st.tuner()->Table();
    EXPECT_EQ(st.reducer().plan().options().bucket_cap_bytes, fast);
  });
}

TEST(TrainingStack, FullyShardedMatchesReferenceAtEveryForward) {
  constexpr int kUnits = 3;
  const OptScenario s = TwoGroupScenario(1, 2);
  RunRanks(2, [&](Group& world) {
    StackOptions so;
    so.reducer.mode = sched::ReduceMode::kReduceScatter;
    so.reducer.bucket_cap_bytes = so.reducer.first_bucket_cap_bytes = size_t{1} << 30;
    so.reducer.shard_gradients = true;
    absl::StatusOr<std::unique_ptr<TrainingStack>> made =
        TrainingStack::Create(Specs(s, kUnits), {&world, nullptr}, so);
    ASSERT_TRUE(made.ok()) << made.status();
    TrainingStack& st = **made;
    ParamOptions po;
    po.optimizer = s.opt;
    po.fully_sharded = true;
    ASSERT_OK(st.AddParamSide(po));
    ASSERT_NE(st.units(), nullptr);
    for (size_t i = 0; i < s.counts.size(); ++i) {
      std::vector<float> init(s.counts[i]);
      for (size_t j = 0; j < init.size(); ++j) init[j] = InitialValue(static_cast<int>(i), j);
      ASSERT_OK(st.optimizer()->SetParam(static_cast<sched::ParamId>(i), init.data()));
    }
    ExpectError(st.Replan(64, 64).status(), absl::StatusCode::kFailedPrecondition,
                {"fully_sharded"});
    const std::vector<int> unit_of = [&] {
      std::vector<int> u;
      for (const sched::ParamSpec& p : Specs(s, kUnits)) u.push_back(p.unit);
      return u;
    }();
    for (int t = 0; t <= s.steps; ++t) {
      const std::vector<std::vector<uint8_t>> want = ReferenceParams(s, t);
      for (int u = 0; u < kUnits; ++u) {  // the forward reads each unit's parameters
        ASSERT_OK(st.units()->BeginForward(u));
        for (size_t i = 0; i < s.counts.size(); ++i) {
          if (unit_of[i] != u) continue;
          absl::StatusOr<TensorView> v = st.gatherer()->ParamView(static_cast<sched::ParamId>(i));
          ASSERT_TRUE(v.ok()) << v.status();
          EXPECT_EQ(std::memcmp(v->data, want[i].data(), want[i].size()), 0)
              << "parameter " << i << " at step " << t;
        }
        ASSERT_OK(st.units()->EndForward(u));
      }
      if (t == s.steps) break;
      ASSERT_OK(st.BeginBackward(sched::SyncMode::kSync));
      for (int u = kUnits - 1; u >= 0; --u) {
        ASSERT_OK(st.units()->BeginBackward(u));
        for (size_t i = 0; i < s.counts.size(); ++i) {
          if (unit_of[i] != u) continue;
          std::vector<float> g(s.counts[i]);
          for (size_t j = 0; j < g.size(); ++j)
            g[j] = Grad(world.rank(), t, 0, static_cast<int>(i), j, s);
          ASSERT_OK(st.reducer().MarkReady(static_cast<sched::ParamId>(i), {}, g.data()));
        }
        ASSERT_OK(st.units()->EndBackward(u));
      }
      ASSERT_OK(st.FinishBackward());
      ASSERT_OK(st.units()->EndStep());
    }
  });
}

TEST(TrainingStack, RefusesMisuse) {
  const OptScenario s = TwoGroupScenario(1, 2);
  RunRanks(2, [&](Group& world) {
    absl::StatusOr<Built> built = Build(world, s);
    ASSERT_TRUE(built.ok()) << built.status();
    TrainingStack& st = *built->stack;
    ExpectError(st.AddParamSide(ParamOptions{}), absl::StatusCode::kFailedPrecondition,
                {"already has an optimizer"});
    ASSERT_OK(st.BeginBackward(sched::SyncMode::kNoSync));
    EXPECT_TRUE(st.in_backward());
    ExpectError(st.ZeroGrads(), absl::StatusCode::kFailedPrecondition, {"backward"});
    ExpectError(st.Replan(64, 64).status(), absl::StatusCode::kFailedPrecondition, {"backward"});
    ASSERT_OK(st.FinishBackward());
    EXPECT_FALSE(st.in_backward());
    st.DropParamSide();
    EXPECT_EQ(st.optimizer(), nullptr);
    ExpectError(st.LiveOptimizer().status(), absl::StatusCode::kFailedPrecondition,
                {"no optimizer"});
  });
}

}  // namespace
}  // namespace braid::optim::testing
