// UnitScheduler on the local backend (2 and 4 ranks as threads). Every rank writes distinct bit
// patterns into its shard of every bucket each step; after BeginForward / BeginBackward of a
// unit, every parameter of the unit must equal the serial reference (the concatenation of all
// ranks' shards). Random unit orders (the same permutation on every rank) over 4 steps, forward
// then reverse backward with EndBackward on other threads; the live-bytes limit, the memory
// accounting (gathered + pooled == MemoryStats' kParamGather) and no new gather buffers in
// steady state; prefetch only after the recording step; order mismatch across ranks at the
// first EndStep; deviations after recording; units kept gathered; GatherAll / ReleaseAll; bad
// input.
#include "scheduler/unit_scheduler.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <fstream>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "gtest/gtest.h"
#include "scheduler/memory_stats.h"
#include "scheduler/param_gatherer.h"
#include "scheduler/timeline.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

constexpr int kUnits = 5;

// Each unit: two f32 parameters and a bf16 one, sizes varying by unit (so units differ in
// bytes and have several buckets each).
std::vector<ParamSpec> UnitParams(int units = kUnits) {
  std::vector<ParamSpec> ps;
  ParamId id = 10;
  for (int u = 0; u < units; ++u) {
    const size_t sizes[] = {static_cast<size_t>(100 + 37 * u), static_cast<size_t>(513 - 50 * u),
                            static_cast<size_t>(77 + 300 * (u % 2))};
    const DType dts[] = {DType::kF32, DType::kF32, DType::kBF16};
    for (int i = 0; i < 3; ++i) {
      ParamSpec p{id++, sizes[i], dts[i], Device::Cpu(), absl::StrCat("block", u, ".p", i)};
      p.unit = u;
      ps.push_back(p);
    }
  }
  return ps;
}

// Units of identical shape: one f32 parameter of 256 elements each (the transport cannot tell
// their gathers apart).
std::vector<ParamSpec> UniformParams(int units) {
  std::vector<ParamSpec> ps;
  for (int u = 0; u < units; ++u) {
    ParamSpec p{100 + u, 256, DType::kF32, Device::Cpu(), absl::StrCat("u", u)};
    p.unit = u;
    ps.push_back(p);
  }
  return ps;
}

BucketPlan MakePlan(std::vector<ParamSpec> params, int shards) {
  PlanOptions o;
  o.shards = shards;
  o.first_bucket_cap_bytes = 256;
  o.bucket_cap_bytes = 1024;
  auto plan = BucketPlan::Build(std::move(params), o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

uint8_t ShardByte(int r, int b, size_t j, int k) {
  uint64_t z = (((static_cast<uint64_t>(r) * 977 + b) * 31 + k) << 32) + j + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint8_t>(z ^ (z >> 31));
}

void WriteShards(ParamGatherer& pg, int r, int k) {
  for (int b = 0; b < pg.num_buckets(); ++b) {
    auto sv = pg.ShardView(b);
    ASSERT_TRUE(sv.ok()) << sv.status();
    auto* p = static_cast<uint8_t*>(sv->data);
    for (size_t j = 0; j < sv->bytes(); ++j) p[j] = ShardByte(r, b, j, k);
  }
}

// Every parameter of unit u against the concatenation of every rank's shard (round k).
void ExpectUnitMatches(const ParamGatherer& pg, int u, int ranks, int k) {
  const BucketPlan& plan = pg.plan();
  for (int b : plan.UnitBuckets(u)) {
    const Bucket& bk = plan.buckets()[b];
    const size_t shard_bytes = bk.shard_count * DTypeSize(bk.dtype);
    for (int p : bk.params) {
      const ParamSpec& ps = plan.params()[p];
      auto v = pg.ParamView(ps.id);
      ASSERT_TRUE(v.ok()) << v.status();
      const uint8_t* got = static_cast<const uint8_t*>(v->data);
      const size_t start = plan.slot(p).offset * DTypeSize(ps.dtype);
      for (size_t j = 0; j < v->bytes(); ++j) {
        const size_t at = start + j;
        ASSERT_EQ(got[j], ShardByte(static_cast<int>(at / shard_bytes), b, at % shard_bytes, k))
            << "unit " << u << ", bucket " << b << ", parameter " << ps.Label() << ", byte " << j
            << ", round " << k;
      }
    }
  }
}

int64_t GatherCurrent(const MemoryStats& m) {
  return m.Snapshot().by_use[static_cast<int>(MemoryUse::kParamGather)].current;
}

struct Rig {
  MemoryStats memory;
  std::unique_ptr<ParamGatherer> pg;
  std::unique_ptr<UnitScheduler> us;
};

void MakeRig(Rig& rig, Group& g, BucketPlan plan, const UnitConfig& uc, bool fully_sharded = true) {
  GathererConfig gc;
  gc.timeout = absl::Seconds(30);
  gc.fully_sharded = fully_sharded;
  gc.memory = &rig.memory;
  auto pg = ParamGatherer::Create(plan, &g, gc);
  ASSERT_TRUE(pg.ok()) << pg.status();
  rig.pg = *std::move(pg);
  auto us = UnitScheduler::Create(rig.pg.get(), uc);
  ASSERT_TRUE(us.ok()) << us.status();
  rig.us = *std::move(us);
}

int64_t LargestUnit(const BucketPlan& plan) {
  int64_t largest = 0;
  for (int u = 0; u < plan.num_units(); ++u) {
    int64_t bytes = 0;
    for (int b : plan.UnitBuckets(u)) bytes += static_cast<int64_t>(plan.buckets()[b].bytes());
    largest = std::max(largest, bytes);
  }
  return largest;
}

// The bound and the accounting at any quiet point.
void ExpectMemoryConsistent(const Rig& rig, int64_t limit) {
  EXPECT_LE(rig.us->live_bytes(), limit);
  EXPECT_LE(rig.us->peak_live_bytes(), limit);
  const int64_t held = rig.pg->held_bytes();
  EXPECT_GE(held, rig.us->live_bytes());      // a held buffer may be a larger pooled one
  EXPECT_LE(held, 2 * rig.us->live_bytes());  // best fit wastes at most half
  EXPECT_EQ(GatherCurrent(rig.memory), held + rig.pg->pooled_bytes());  // pooled are counted
}

// ---- random orders, values, limit, prefetch, threaded EndBackward ---------------------------

struct Scenario {
  int ranks;
  int prefetch;
  unsigned seed;
};
void PrintTo(const Scenario& s, std::ostream* os) {
  *os << s.ranks << " ranks, prefetch " << s.prefetch << ", seed " << s.seed;
}
class RandomOrders : public ::testing::TestWithParam<Scenario> {};

TEST_P(RandomOrders, ValuesLimitPrefetchAndSteadyAllocations) {
  const Scenario sc = GetParam();
  std::vector<int> perm(kUnits);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(sc.seed));  // the same on every rank
  RunRanks(sc.ranks, [&](Group& g) {
    const int r = g.rank();
    const BucketPlan plan = MakePlan(UnitParams(), sc.ranks);
    UnitConfig uc;
    uc.prefetch = sc.prefetch;
    uc.timeout = absl::Seconds(30);
    Rig rig;
    MakeRig(rig, g, plan, uc);
    ASSERT_TRUE(rig.us);
    UnitScheduler& us = *rig.us;
    const int64_t limit = 2 * LargestUnit(plan);
    for (int k = 0; k < 4; ++k) {
      WriteShards(*rig.pg, r, k);
      const int64_t at_start = us.gathers_issued();
      for (int i = 0; i < kUnits; ++i) {
        const int u = perm[i];
        const int64_t before = us.gathers_issued() - at_start;
        if (k == 0 || sc.prefetch == 0) {
          EXPECT_EQ(before, i) << "unit " << u << " step " << k;  // nothing prefetched
        } else if (i > 0) {
          EXPECT_GE(before, i + 1) << "unit " << u << " was not prefetched, step " << k;
        }
        ASSERT_OK(us.BeginForward(u));
        ExpectUnitMatches(*rig.pg, u, sc.ranks, k);
        ExpectMemoryConsistent(rig, limit);
        ASSERT_OK(us.EndForward(u));
      }
      EXPECT_EQ(us.gathers_issued() - at_start, kUnits);
      // Backward in reverse; EndBackward on other threads, each joined before the unit after
      // the next is entered (the condition under which the limit bounds required gathers).
      std::deque<std::thread> enders;
      for (int i = kUnits - 1; i >= 0; --i) {
        const int u = perm[i];
        if (enders.size() == 2) {
          enders.front().join();
          enders.pop_front();
        }
        ASSERT_OK(us.BeginBackward(u));
        ExpectUnitMatches(*rig.pg, u, sc.ranks, k);
        EXPECT_LE(us.live_bytes(), limit);
        enders.emplace_back([&us, u] { EXPECT_OK(us.EndBackward(u)); });
      }
      for (auto& t : enders) t.join();
      EXPECT_EQ(us.gathers_issued() - at_start, 2 * kUnits);
      ASSERT_OK(us.EndStep());
      EXPECT_EQ(us.live_bytes(), 0);
      ExpectMemoryConsistent(rig, limit);
      EXPECT_EQ(rig.pg->held_bytes(), 0);
      EXPECT_EQ(us.forward_order(), perm);
    }
    EXPECT_LE(us.peak_live_bytes(), limit);
    EXPECT_GT(rig.pg->pooled_bytes(), 0);
    EXPECT_OK(rig.pg->CheckIssueOrder());
  });
}

INSTANTIATE_TEST_SUITE_P(Units, RandomOrders,
                         ::testing::Values(Scenario{2, 1, 1}, Scenario{2, 2, 2}, Scenario{4, 1, 3},
                                           Scenario{4, 2, 4}, Scenario{2, 0, 5}, Scenario{4, 3, 6}),
                         [](const ::testing::TestParamInfo<Scenario>& i) {
                           return absl::StrCat(i.param.ranks, "ranks_prefetch", i.param.prefetch,
                                               "_seed", i.param.seed);
                         });

// A limit of exactly the largest unit: prefetches are deferred (a unit is live whenever
// another would be prefetched), required gathers still happen, values still right.
TEST(UnitScheduler, TightLimitDefersPrefetches) {
  RunRanks(2, [&](Group& g) {
    const BucketPlan plan = MakePlan(UnitParams(), 2);
    UnitConfig uc;
    uc.prefetch = 2;
    uc.max_live_bytes = static_cast<size_t>(LargestUnit(plan));
    Rig rig;
    MakeRig(rig, g, plan, uc);
    ASSERT_TRUE(rig.us);
    for (int k = 0; k < 3; ++k) {
      WriteShards(*rig.pg, g.rank(), k);
      for (int u = 0; u < kUnits; ++u) {
        ASSERT_OK(rig.us->BeginForward(u));
        ExpectUnitMatches(*rig.pg, u, 2, k);
        EXPECT_LE(rig.us->live_bytes(), LargestUnit(plan));
        ASSERT_OK(rig.us->EndForward(u));
      }
      for (int u = kUnits - 1; u >= 0; --u) {
        ASSERT_OK(rig.us->BeginBackward(u));
        ExpectUnitMatches(*rig.pg, u, 2, k);
        ASSERT_OK(rig.us->EndBackward(u));
      }
      ASSERT_OK(rig.us->EndStep());
    }
    EXPECT_LE(rig.us->peak_live_bytes(), LargestUnit(plan));
    EXPECT_EQ(rig.us->gathers_issued(), 3 * 2 * kUnits);
  });
}

// Steady state: once a step with prefetch has run, later steps take every gather buffer from
// the pool (single-threaded, so every step acquires and releases in the same sequence).
TEST(UnitScheduler, SteadyStateStepAllocatesNoGatherBuffer) {
  for (unsigned seed : {11u, 12u, 13u}) {
    for (int prefetch : {1, 2}) {
      std::vector<int> perm(kUnits);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
      RunRanks(2, [&](Group& g) {
        UnitConfig uc;
        uc.prefetch = prefetch;
        Rig rig;
        MakeRig(rig, g, MakePlan(UnitParams(), 2), uc);
        ASSERT_TRUE(rig.us);
        std::vector<int64_t> allocations;
        for (int k = 0; k < 4; ++k) {
          WriteShards(*rig.pg, g.rank(), k);
          for (int u : perm) {
            ASSERT_OK(rig.us->BeginForward(u));
            ExpectUnitMatches(*rig.pg, u, 2, k);
            ASSERT_OK(rig.us->EndForward(u));
          }
          for (auto it = perm.rbegin(); it != perm.rend(); ++it) {
            ASSERT_OK(rig.us->BeginBackward(*it));
            ExpectUnitMatches(*rig.pg, *it, 2, k);
            ASSERT_OK(rig.us->EndBackward(*it));
          }
          ASSERT_OK(rig.us->EndStep());
          allocations.push_back(rig.memory.Snapshot().allocations);
          EXPECT_EQ(GatherCurrent(rig.memory), rig.pg->pooled_bytes());
        }
        EXPECT_GT(allocations[0], 0);
        EXPECT_EQ(allocations[2], allocations[1]) << "seed " << seed << ", prefetch " << prefetch;
        EXPECT_EQ(allocations[3], allocations[1]) << "seed " << seed << ", prefetch " << prefetch;
      });
    }
  }
}

// before_gather: once per bucket of every forward gather (and GatherAll), never in backward;
// its event reaches the gather; an error fails the launch, names the bucket and sticks.
TEST(UnitScheduler, BeforeGatherRunsForForwardGathersOnly) {
  RunRanks(2, [&](Group& g) {
    const BucketPlan plan = MakePlan(UnitParams(3), 2);
    std::atomic<int> calls{0};
    std::atomic<int> fail_bucket{-1};
    UnitConfig uc;
    uc.before_gather = [&](int b, DeviceEvent* ready) {
      ++calls;
      EXPECT_NE(ready, nullptr);
      if (b == fail_bucket.load()) return absl::InternalError("optimizer step failed");
      return absl::OkStatus();
    };
    Rig rig;
    MakeRig(rig, g, plan, uc);
    ASSERT_TRUE(rig.us);
    UnitScheduler& us = *rig.us;
    int forward_buckets = 0;
    for (int k = 0; k < 2; ++k) {
      for (int u = 0; u < 3; ++u) {
        ASSERT_OK(us.BeginForward(u));
        ASSERT_OK(us.EndForward(u));
        if (k == 0) forward_buckets += static_cast<int>(plan.UnitBuckets(u).size());
      }
      EXPECT_EQ(calls.load(), (k + 1) * forward_buckets);
      for (int u = 2; u >= 0; --u) {
        ASSERT_OK(us.BeginBackward(u));
        ASSERT_OK(us.EndBackward(u));
      }
      EXPECT_EQ(calls.load(), (k + 1) * forward_buckets);  // none in backward
      ASSERT_OK(us.EndStep());
    }
    ASSERT_OK(us.GatherAll());
    EXPECT_EQ(calls.load(), 3 * forward_buckets);
    ASSERT_OK(us.ReleaseAll());
    const int first = plan.UnitBuckets(0)[0];
    fail_bucket = first;
    ExpectError(us.BeginForward(0), absl::StatusCode::kInternal,
                {absl::StrCat("before_gather(bucket ", first, ")"), "optimizer step failed"});
    ExpectError(us.BeginForward(0), absl::StatusCode::kInternal, {"optimizer step failed"});
  });
}

TEST(UnitScheduler, TimelineShowsGatherAndReleaseOnTheUnitsRow) {
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/units_trace");
  RunRanks(2, [&](Group& g) {
    auto tl = Timeline::Create(prefix, g.rank());
    ASSERT_TRUE(tl.ok()) << tl.status();
    UnitConfig uc;
    uc.timeline = tl->get();
    {
      Rig rig;
      MakeRig(rig, g, MakePlan(UnitParams(2), 2), uc);
      ASSERT_TRUE(rig.us);
      ASSERT_OK(rig.us->BeginForward(1));
      ASSERT_OK(rig.us->EndForward(1));
    }
    ASSERT_OK((*tl)->Close());
    std::ifstream in((*tl)->path());
    const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const char* part : {"\"gather unit\"", "\"release unit\"", "\"units\""}) {
      EXPECT_NE(json.find(part), std::string::npos) << part << " missing from " << (*tl)->path();
    }
  });
}

// ---- order checks ----------------------------------------------------------------------------

TEST(UnitSchedulerErrors, OrderDifferingBetweenRanksIsCaughtAtTheFirstEndStep) {
  RunRanks(2, [&](Group& g) {
    Rig rig;
    MakeRig(rig, g, MakePlan(UniformParams(4), 2), UnitConfig{});
    ASSERT_TRUE(rig.us);
    const std::vector<int> order =
        g.rank() == 0 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{1, 0, 2, 3};
    for (int u : order) {
      ASSERT_OK(rig.us->BeginForward(u));  // same shapes: the transport cannot tell
      ASSERT_OK(rig.us->EndForward(u));
    }
    ExpectError(
        rig.us->EndStep(), absl::StatusCode::kFailedPrecondition,
        {"forward order", "rank 0: 4 unit(s) [0, 1, 2, 3]", "rank 1: 4 unit(s) [1, 0, 2, 3]"});
  });
}

TEST(UnitSchedulerErrors, DeviationAfterRecordingNamesExpectedAndActual) {
  RunRanks(2, [&](Group& g) {
    Rig rig;
    MakeRig(rig, g, MakePlan(UnitParams(4), 2), UnitConfig{});
    ASSERT_TRUE(rig.us);
    UnitScheduler& us = *rig.us;
    for (int u : {2, 0, 1, 3}) {
      ASSERT_OK(us.BeginForward(u));
      ASSERT_OK(us.EndForward(u));
    }
    ASSERT_OK(us.EndStep());
    WriteShards(*rig.pg, g.rank(), 1);
    ASSERT_OK(us.BeginForward(2));  // prefetches 0
    const int64_t issued = us.gathers_issued();
    ExpectError(
        us.BeginForward(1), absl::StatusCode::kFailedPrecondition,
        {"entering the forward of unit 1", "expected unit 0 next", "got unit 1", "[2, 0, 1, 3]"});
    EXPECT_EQ(us.gathers_issued(), issued);  // the error launched nothing
    // Back on track: the step completes, values right.
    ASSERT_OK(us.EndForward(2));
    for (int u : {0, 1, 3}) {
      ASSERT_OK(us.BeginForward(u));
      ExpectUnitMatches(*rig.pg, u, 2, 1);
      ASSERT_OK(us.EndForward(u));
    }
    ASSERT_OK(us.BeginBackward(3));
    ExpectError(
        us.BeginBackward(0), absl::StatusCode::kFailedPrecondition,
        {"entering the backward of unit 0", "expected unit 1 next", "got unit 0", "[3, 1, 0, 2]"});
    ASSERT_OK(us.EndBackward(3));
    for (int u : {1, 0, 2}) {
      ASSERT_OK(us.BeginBackward(u));
      ASSERT_OK(us.EndBackward(u));
    }
    ASSERT_OK(us.EndStep());
    EXPECT_OK(rig.pg->CheckIssueOrder());
  });
}

// A root unit kept from its forward into the backward and entered there first (out of the
// backward order) is fine: it is gathered, its backward position is skipped.
TEST(UnitScheduler, AlreadyGatheredUnitOutOfOrderIsOk) {
  RunRanks(2, [&](Group& g) {
    Rig rig;
    MakeRig(rig, g, MakePlan(UnitParams(4), 2), UnitConfig{});
    ASSERT_TRUE(rig.us);
    UnitScheduler& us = *rig.us;
    for (int k = 0; k < 3; ++k) {
      WriteShards(*rig.pg, g.rank(), k);
      const int64_t at_start = us.gathers_issued();
      ASSERT_OK(us.BeginForward(0));  // the root: no EndForward
      for (int u : {1, 2, 3}) {
        ASSERT_OK(us.BeginForward(u));
        ASSERT_OK(us.EndForward(u));
      }
      ASSERT_OK(us.BeginBackward(0));  // out of order (expected 3), but gathered
      ExpectUnitMatches(*rig.pg, 0, 2, k);
      ASSERT_OK(us.EndBackward(0));
      for (int u : {3, 2, 1}) {
        ASSERT_OK(us.BeginBackward(u));
        ExpectUnitMatches(*rig.pg, u, 2, k);
        ASSERT_OK(us.EndBackward(u));
      }
      ASSERT_OK(us.EndStep());
      EXPECT_EQ(us.live_bytes(), 0);
      EXPECT_EQ(us.gathers_issued() - at_start, 4 + 3);  // unit 0 not gathered again
    }
    EXPECT_OK(rig.pg->CheckIssueOrder());
  });
}

TEST(UnitScheduler, NoReshardAfterForwardKeepsUnitsUntilEndBackward) {
  RunRanks(2, [&](Group& g) {
    const BucketPlan plan = MakePlan(UnitParams(4), 2);
    UnitConfig uc;
    uc.reshard_after_forward = false;
    Rig rig;
    MakeRig(rig, g, plan, uc);
    ASSERT_TRUE(rig.us);
    UnitScheduler& us = *rig.us;
    int64_t total = 0;
    for (int u = 0; u < 4; ++u) {
      for (int b : plan.UnitBuckets(u)) total += static_cast<int64_t>(plan.buckets()[b].bytes());
    }
    for (int k = 0; k < 3; ++k) {
      WriteShards(*rig.pg, g.rank(), k);
      for (int u = 0; u < 4; ++u) {
        ASSERT_OK(us.BeginForward(u));
        ASSERT_OK(us.EndForward(u));
        for (int b : plan.UnitBuckets(u)) EXPECT_TRUE(rig.pg->IsGathered(b)) << "unit " << u;
      }
      EXPECT_EQ(us.live_bytes(), total);
      const int64_t issued = us.gathers_issued();
      for (int u = 3; u >= 0; --u) {
        ASSERT_OK(us.BeginBackward(u));
        ExpectUnitMatches(*rig.pg, u, 2, k);
        ASSERT_OK(us.EndBackward(u));
        for (int b : plan.UnitBuckets(u)) EXPECT_FALSE(rig.pg->IsGathered(b)) << "unit " << u;
      }
      EXPECT_EQ(us.gathers_issued(), issued);  // the backward gathered nothing
      ASSERT_OK(us.EndStep());
      EXPECT_EQ(us.live_bytes(), 0);
    }
  });
}

TEST(UnitScheduler, GatherAllKeepsEverythingUntilReleaseAll) {
  RunRanks(4, [&](Group& g) {
    const BucketPlan plan = MakePlan(UnitParams(), 4);
    Rig rig;
    MakeRig(rig, g, plan, UnitConfig{});
    ASSERT_TRUE(rig.us);
    UnitScheduler& us = *rig.us;
    WriteShards(*rig.pg, g.rank(), 7);
    ASSERT_OK(us.GatherAll());
    for (int u = 0; u < kUnits; ++u) ExpectUnitMatches(*rig.pg, u, 4, 7);
    ExpectError(us.BeginForward(0), absl::StatusCode::kFailedPrecondition,
                {"unit 0", "end the summon"});
    ASSERT_OK(us.ReleaseAll());
    EXPECT_EQ(us.live_bytes(), 0);
    EXPECT_EQ(rig.pg->held_bytes(), 0);
    EXPECT_EQ(rig.pg->pooled_bytes(), 0);  // the summoned model's buffers went back
    for (int u = 0; u < kUnits; ++u) {
      ASSERT_OK(us.BeginForward(u));
      ExpectUnitMatches(*rig.pg, u, 4, 7);
      ASSERT_OK(us.EndForward(u));
    }
    ASSERT_OK(us.EndStep());
  });
}

TEST(UnitSchedulerErrors, BadInputNamesTheItem) {
  RunRanks(2, [&](Group& g) {
    // Units 0, 1 and 3: unit 2 has no bucket.
    std::vector<ParamSpec> ps = UnitParams(4);
    for (ParamSpec& p : ps) {
      if (p.unit == 2) p.unit = 1;
    }
    const BucketPlan plan = MakePlan(ps, 2);
    {
      Rig rig;
      GathererConfig gc;
      gc.fully_sharded = false;
      auto pg = ParamGatherer::Create(plan, &g, gc);
      ASSERT_TRUE(pg.ok());
      ExpectError(UnitScheduler::Create(pg->get(), UnitConfig{}).status(),
                  absl::StatusCode::kInvalidArgument, {"fully_sharded"});
    }
    Rig rig;
    MakeRig(rig, g, plan, UnitConfig{});
    ASSERT_TRUE(rig.us);
    UnitConfig small;
    small.max_live_bytes = 64;
    ExpectError(UnitScheduler::Create(rig.pg.get(), small).status(),
                absl::StatusCode::kInvalidArgument,
                {"max_live_bytes = 64", absl::StrCat(LargestUnit(plan), " bytes of unit ")});
    UnitScheduler& us = *rig.us;
    ExpectError(us.BeginForward(9), absl::StatusCode::kInvalidArgument, {"unit 9", "no such unit"});
    ExpectError(us.BeginForward(-1), absl::StatusCode::kInvalidArgument, {"unit -1"});
    ExpectError(us.BeginBackward(2), absl::StatusCode::kInvalidArgument, {"unit 2 has no bucket"});
    ExpectError(us.EndForward(1), absl::StatusCode::kFailedPrecondition,
                {"leaving the forward of unit 1", "forward"});
    ExpectError(us.EndBackward(3), absl::StatusCode::kFailedPrecondition,
                {"leaving the backward of unit 3", "backward"});
    ASSERT_OK(us.BeginForward(0));
    ExpectError(us.EndBackward(0), absl::StatusCode::kFailedPrecondition,
                {"leaving the backward of unit 0", "backward"});
    ExpectError(us.EndStep(), absl::StatusCode::kFailedPrecondition, {"unit 0"});
    ASSERT_OK(us.EndForward(0));
    ASSERT_OK(us.BeginBackward(0));
    ExpectError(us.BeginForward(1), absl::StatusCode::kFailedPrecondition,
                {"entering the forward of unit 1", "backward"});
    ASSERT_OK(us.EndBackward(0));
    ASSERT_OK(us.EndStep());
    // Later EndSteps are local and name what is still held.
    ASSERT_OK(us.BeginForward(0));
    ExpectError(us.EndStep(), absl::StatusCode::kFailedPrecondition, {"unit 0 (in its forward"});
  });
}

}  // namespace
}  // namespace braid::sched
