// Autotuner (scheduler/autotuner.h) on the local backend with synthetic step times: the
// successive-halving schedule step by step, the winner chosen on the slowest rank's figures
// (identical on every rank), the default kept unless beaten by min_gain, the trial table,
// config checks.
#include "scheduler/autotuner.h"

#include <cstring>
#include <map>
#include <vector>

#include "comm/element.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "tests/multirank.h"
#include "tests/reducer_reference.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

AutotunerConfig FourCandidates() {
  AutotunerConfig c;
  c.candidates = {{1000, 0}, {1000, 100}, {2000, 100}, {500, 50}};
  c.steps_per_trial = 2;
  c.min_gain = 0.03;
  c.timeout = absl::Seconds(30);
  return c;
}

// Runs the tuner to the end with step times ms(rank, candidate); returns the candidate run at
// each step.
std::vector<int> Drive(Autotuner& t, int rank, double (*ms)(int, int)) {
  std::vector<int> ran;
  for (int step = 0; step < 1000 && !t.done(); ++step) {
    ran.push_back(t.current_index());
    const int before = t.current_index();
    auto changed = t.EndStep(absl::Milliseconds(ms(rank, t.current_index())));
    EXPECT_TRUE(changed.ok()) << changed.status();
    if (!changed.ok()) break;
    EXPECT_EQ(*changed, t.current_index() != before);
  }
  return ran;
}

// Candidate 1 is the fastest on rank 0 but the slowest on rank 1: a step is as slow as its
// slowest rank, so candidate 2 must win, on every rank.
double Times(int rank, int c) {
  const double base[] = {100, 90, 80, 95};
  if (c == 1 && rank == 1) return 200;
  return base[c] + rank;
}

TEST(Autotuner, SuccessiveHalvingOnTheSlowestRank) {
  RunRanks(2, [](Group& g) {
    auto t = Autotuner::Create(&g, FourCandidates());
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->current_index(), 0);
    const std::vector<int> ran = Drive(**t, g.rank(), Times);
    // Round 0: 1 + 2 round-robin passes over {0, 1, 2, 3}; maxima c0 101, c1 200, c2 81,
    // c3 96 -> survivors {2, 3}: 1 + 4 passes; c2 wins; the default did not run in that round:
    // a confirmation round {0, 2} of 1 + 8 passes.
    std::vector<int> want;
    for (int pass = 0; pass < 3; ++pass) want.insert(want.end(), {0, 1, 2, 3});
    for (int pass = 0; pass < 5; ++pass) want.insert(want.end(), {2, 3});
    for (int pass = 0; pass < 9; ++pass) want.insert(want.end(), {0, 2});
    EXPECT_EQ(ran, want);
    ASSERT_TRUE((*t)->done());
    EXPECT_EQ((*t)->winner(), 2);
    EXPECT_EQ((*t)->current().bucket_cap_bytes, 2000u);
    const auto& trials = (*t)->trials();
    ASSERT_EQ(trials.size(), 8u);
    EXPECT_EQ(trials[6].candidate, 0);
    EXPECT_EQ(trials[6].round, 2);
    EXPECT_EQ(trials[7].steps, 8);
    EXPECT_EQ(trials[1].candidate, 1);
    EXPECT_DOUBLE_EQ(trials[1].median_ms, 200);  // rank 1's figure, on both ranks
    EXPECT_FALSE(trials[1].survived);
    EXPECT_TRUE(trials[2].survived);
    EXPECT_EQ(trials[4].round, 1);
    EXPECT_EQ(trials[4].steps, 4);
    EXPECT_NE((*t)->Table().find("adopted: candidate 2"), std::string::npos) << (*t)->Table();
    // Done: no more changes, no more collectives.
    auto more = (*t)->EndStep(absl::Milliseconds(1));
    ASSERT_TRUE(more.ok());
    EXPECT_FALSE(*more);
  });
}

TEST(Autotuner, DefaultKeptUnlessBeatenByMinGain) {
  RunRanks(2, [](Group& g) {
    AutotunerConfig c = FourCandidates();
    auto t = Autotuner::Create(&g, c);
    ASSERT_TRUE(t.ok());
    Drive(**t, g.rank(), [](int, int cand) { return cand == 3 ? 98.0 : 100.0; });  // 2% < min_gain
    ASSERT_TRUE((*t)->done());
    EXPECT_EQ((*t)->winner(), 0);
    EXPECT_NE((*t)->Table().find("the default"), std::string::npos);
  });
  RunRanks(2, [](Group& g) {
    auto t = Autotuner::Create(&g, FourCandidates());
    ASSERT_TRUE(t.ok());
    Drive(**t, g.rank(), [](int, int cand) { return cand == 3 ? 90.0 : 100.0; });  // 10%
    EXPECT_EQ((*t)->winner(), 3);
  });
}

TEST(Autotuner, SingleCandidateIsDoneAtOnce) {
  RunRanks(1, [](Group& g) {
    AutotunerConfig c;
    c.candidates = {{1000, 0}};
    auto t = Autotuner::Create(&g, c);
    ASSERT_TRUE(t.ok());
    EXPECT_TRUE((*t)->done());
    EXPECT_EQ((*t)->winner(), 0);
  });
}

TEST(Autotuner, BadConfigsAndRanksThatDisagree) {
  RunRanks(2, [](Group& g) {
    AutotunerConfig c = FourCandidates();
    c.candidates.clear();
    ExpectError(Autotuner::Create(&g, c).status(), absl::StatusCode::kInvalidArgument,
                {"candidates"});
    c = FourCandidates();
    c.steps_per_trial = 0;
    ExpectError(Autotuner::Create(&g, c).status(), absl::StatusCode::kInvalidArgument,
                {"steps_per_trial"});
    c = FourCandidates();
    if (g.rank() == 1) c.candidates[2].credit_bytes = 7;
    ExpectError(Autotuner::Create(&g, c).status(), absl::StatusCode::kFailedPrecondition,
                {"rank 1"});
  });
}

// Adopting a bucket cap: GradientReducer::Replan between steps carries a no_sync window's sums
// over to the new plan; the synced result equals a reducer that never re-planned, bit for bit.
TEST(ReducerReplan, CarriesAccumulatedGradientsOver) {
  for (ReduceMode mode : {ReduceMode::kAllReduce, ReduceMode::kReduceScatter}) {
    RunRanks(2, [&](Group& g) {
      ReducerConfig rc;
      rc.mode = mode;
      rc.first_bucket_cap_bytes = 256;
      rc.bucket_cap_bytes = 4096;
      rc.timeout = absl::Seconds(30);
      const std::vector<ParamSpec> params = reference::MakeParams(3);  // mixed dtypes
      auto a = GradientReducer::Create(params, {&g, nullptr}, rc);
      auto b = GradientReducer::Create(params, {&g, nullptr}, rc);
      ASSERT_TRUE(a.ok() && b.ok());
      auto fill = [&](GradientReducer& r, int micro) {
        for (size_t p = 0; p < params.size(); ++p) {
          auto v = r.GradView(params[p].id);
          ASSERT_TRUE(v.ok());
          for (size_t i = 0; i < v->count; ++i) {
            const double x = LoadElement(v->data, v->dtype, i) + 0.37 * g.rank() + 0.011 * i -
                             0.5 * micro + 0.1 * p;
            StoreElement(v->data, v->dtype, i, x);
          }
          ASSERT_OK(r.MarkReady(params[p].id));
        }
      };
      for (GradientReducer* r : {a->get(), b->get()}) {
        ASSERT_OK(r->ZeroGrads());
        ASSERT_OK(r->BeginBackward(SyncMode::kNoSync));
        fill(*r, 0);
        ASSERT_OK(r->FinishBackward());
      }
      const int buckets_before = static_cast<int>((*b)->plan().buckets().size());
      auto replanned = (*b)->Replan(65536, 65536);
      ASSERT_TRUE(replanned.ok()) << replanned.status();
      EXPECT_TRUE(*replanned);
      EXPECT_NE(static_cast<int>((*b)->plan().buckets().size()), buckets_before);
      EXPECT_EQ((*b)->plan_generation(), 1);
      auto again = (*b)->Replan(65536, 65536);
      ASSERT_TRUE(again.ok());
      EXPECT_FALSE(*again);
      for (GradientReducer* r : {a->get(), b->get()}) {
        ASSERT_OK(r->BeginBackward(SyncMode::kSync));
        fill(*r, 1);
        ASSERT_OK(r->FinishBackward());
      }
      // Compare: all-reduce, every gradient; reduce-scatter, this rank's part of every parameter.
      for (size_t p = 0; p < params.size(); ++p) {
        auto va = (*a)->GradView(params[p].id);
        auto vb = (*b)->GradView(params[p].id);
        const size_t es = DTypeSize(params[p].dtype);
        if (mode == ReduceMode::kAllReduce) {
          EXPECT_EQ(0, std::memcmp(va->data, vb->data, va->count * es)) << "parameter " << p;
          continue;
        }
        const auto in_shard = [&](const GradientReducer& r, size_t i) {
          const BucketPlan& plan = r.plan();
          const Bucket& bk = plan.buckets()[plan.slot(static_cast<int>(p)).bucket];
          const size_t pos = plan.slot(static_cast<int>(p)).offset + i;
          return pos / bk.shard_count == static_cast<size_t>(g.rank());
        };
        for (size_t i = 0; i < va->count; ++i) {
          if (!in_shard(**a, i) || !in_shard(**b, i)) continue;
          EXPECT_EQ(LoadElement(va->data, va->dtype, i), LoadElement(vb->data, vb->dtype, i))
              << p << " " << i;
        }
      }
    });
  }
}

}  // namespace
}  // namespace braid::sched
