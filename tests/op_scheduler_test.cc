// OpScheduler (scheduler/op_scheduler.h) on the local backend:
//  - SplitReduction: partitions cover the call exactly, aligned, within the credit;
//  - partitioned all-reduces / reduce-scatters bit for bit against the unpartitioned call, and
//    the reducer through the scheduler bit for bit against the serial reference (every mode,
//    dtype and accumulation schedule of reducer_test, small credits), and against itself
//    without the scheduler on non-exact gradients;
//  - priorities: an urgent operation in flight holds reductions back until it completes, or
//    until max_hold; a gatherer and a reducer sharing a scheduler (gathers tracked as urgent)
//    give exact results;
//  - a config that differs on one rank fails Create on every rank, naming the ranks;
//  - the timeline shows each partition and its priority.
#include "scheduler/op_scheduler.h"

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/param_gatherer.h"
#include "scheduler/partition.h"
#include "scheduler/timeline.h"
#include "tests/multirank.h"
#include "tests/partition_checks.h"
#include "tests/reducer_reference.h"

namespace braid::sched {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;
using reference::Scenario;

constexpr absl::Duration kTimeout = absl::Seconds(60);

TEST(SplitReduction, CoversExactlyAlignedWithinCredit) {
  for (size_t count :
       {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{1000}, size_t{4097}, size_t{100003}}) {
    for (size_t es : {size_t{2}, size_t{4}, size_t{8}}) {
      for (int ranks : {1, 2, 3, 4}) {
        for (size_t credit : {size_t{0}, size_t{64}, size_t{256}, size_t{1000}, size_t{1} << 16}) {
          const std::vector<PartRange> parts = SplitReduction(count, es, ranks, credit);
          ASSERT_FALSE(parts.empty());
          size_t next = 0;
          const size_t align = 64 / es;
          for (size_t k = 0; k < parts.size(); ++k) {
            EXPECT_EQ(parts[k].lo, next);
            EXPECT_GE(parts[k].hi, parts[k].lo);
            if (k + 1 < parts.size()) {
              EXPECT_EQ(parts[k].hi % align, 0u) << count << " " << es << " " << credit;
            }
            const size_t bytes = parts[k].count() * es * ranks;
            if (credit > 0 && parts.size() > 1) {
              EXPECT_LE(bytes, std::max(credit, align * es * ranks));
            }
            next = parts[k].hi;
          }
          EXPECT_EQ(next, count);
          if (credit == 0 || count * es * ranks <= credit) {
            EXPECT_EQ(parts.size(), 1u);
          }
        }
      }
    }
  }
}

double Noise(int r, size_t i) {
  uint64_t z = (static_cast<uint64_t>(r) << 40) + i * 0x9e3779b97f4a7c15ull + 12345;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

// SubmitReduction of odd sizes, partitioned, equals the direct call byte for byte.
TEST(OpScheduler, PartitionedCollectivesMatchDirectCalls) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64}) {
    for (int n : {2, 3, 4}) {
      RunRanks(n, [&](Group& g) {
        OpSchedulerConfig oc;
        oc.credit_bytes = 320;  // not a multiple of the alignment on purpose
        auto sch = OpScheduler::Create(oc, &g);
        ASSERT_TRUE(sch.ok()) << sch.status();
        const size_t es = DTypeSize(t);
        for (CollectiveKind kind : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter}) {
          const size_t count = 333;  // all-reduce: elements; reduce-scatter: per rank
          const size_t in_count = kind == CollectiveKind::kAllReduce ? count : count * n;
          std::vector<char> a(in_count * es), b(in_count * es);
          for (size_t i = 0; i < in_count; ++i) StoreElement(a.data(), t, i, Noise(g.rank(), i));
          b = a;
          const ReduceOp op = t == DType::kF16 ? ReduceOp::Sum() : ReduceOp::Avg();
          // Direct, in place.
          absl::StatusOr<WorkPtr> w =
              kind == CollectiveKind::kAllReduce
                  ? g.AllReduce(a.data(), a.data(), count, t, op)
                  : g.ReduceScatter(a.data(), a.data() + g.rank() * count * es, count, t, op);
          ASSERT_TRUE(w.ok()) << w.status();
          ASSERT_OK((*w)->Wait(kTimeout));
          ReductionRequest r;
          r.group = &g;
          r.kind = kind;
          r.send = b.data();
          r.recv = kind == CollectiveKind::kAllReduce ? b.data() : b.data() + g.rank() * count * es;
          r.count = count;
          r.dtype = t;
          r.op = op;
          absl::StatusOr<WorkPtr> pw = (*sch)->SubmitReduction(r);
          ASSERT_TRUE(pw.ok()) << pw.status();
          ASSERT_OK((*pw)->Wait(kTimeout));
          const size_t lo = kind == CollectiveKind::kAllReduce ? 0 : g.rank() * count * es;
          EXPECT_EQ(0, std::memcmp(a.data() + lo, b.data() + lo, count * es))
              << DTypeName(t) << " " << CollectiveName(kind) << " rank " << g.rank() << " of " << n;
        }
        EXPECT_GT((*sch)->partitions_issued(), 2 * (*sch)->reductions_submitted());
      });
    }
  }
}

class PartitionedReducerVsReference : public ::testing::TestWithParam<Scenario> {};

double Grad(int r, int p, int m, int s, size_t i) {
  uint64_t z =
      ((((static_cast<uint64_t>(r) * 131 + p) * 17 + m) * 7 + s) << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

double BF16Grad(int r, int p, int m, int s, size_t i) {
  char b[2];
  StoreElement(b, DType::kBF16, 0, Grad(r, p, m, s, i));
  return LoadElement(b, DType::kBF16, 0);
}

TEST_P(PartitionedReducerVsReference, BitExact) {
  const Scenario sc = GetParam();
  RunRanks(sc.replicas * sc.shards, [&](Group& g) {
    EXPECT_OK(
        reference::RunScenario(g, sc, sc.values || sc.shard_gradients ? BF16Grad : Grad, kTimeout));
  });
}

std::vector<Scenario> PartitionScenarios() {
  std::vector<Scenario> out;
  for (size_t credit : {size_t{256}, size_t{1024}}) {
    for (int dt = 0; dt < 4; ++dt) {
      for (const char* sched : {"S", "NNS"}) {
        for (int w : {2, 3, 4}) {
          out.push_back({ReduceMode::kAllReduce, 1, w, dt, sched});
          out.push_back({ReduceMode::kReduceScatter, 1, w, dt, sched});
        }
      }
      for (const char* sched : {"S", "RRS", "NRNS"})
        out.push_back({ReduceMode::kHybrid, 2, 2, dt, sched});
      if (dt == 1 || dt == 2) {
        out.push_back({ReduceMode::kReduceScatter, 1, 4, dt, "NNS", false, true});  // f32 staging
        out.push_back({ReduceMode::kHybrid, 2, 2, dt, "RRS", false, true});
      }
    }
    for (int dt : {0, 1}) {  // shard_gradients: pooled storage, gradients passed at the mark
      Scenario kept{ReduceMode::kReduceScatter, 1, 4, dt, "NNS"};
      kept.shard_gradients = kept.values = true;
      out.push_back(kept);
      Scenario hk{ReduceMode::kHybrid, 2, 2, dt, "RRS"};
      hk.shard_gradients = hk.values = true;
      out.push_back(hk);
    }
    for (Scenario& sc : out) {
      if (sc.credit == 0) sc.credit = credit;
    }
    out.push_back({ReduceMode::kAllReduce, 1, 3, 0, "NNS", true});  // copy-in path
    out.back().credit = credit;
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, PartitionedReducerVsReference,
                         ::testing::ValuesIn(PartitionScenarios()),
                         [](const ::testing::TestParamInfo<Scenario>& i) {
                           return reference::ScenarioName(i.param);
                         });

TEST(OpScheduler, PartitionedReducerMatchesUnpartitionedOnNoise) {
  for (ReduceMode mode :
       {ReduceMode::kAllReduce, ReduceMode::kReduceScatter, ReduceMode::kHybrid}) {
    for (int dtypes : {0, 1, 2, 3}) {
      RunRanks(4, [&](Group& g) {
        EXPECT_OK(
            testing::CheckPartitionedMatchesUnpartitioned(g, mode, dtypes, 256, false, kTimeout));
      });
    }
  }
}

// One rank-local urgent operation in flight holds a reduction back until it completes.
TEST(OpScheduler, UrgentWorkHoldsReductionsUntilItCompletes) {
  RunRanks(2, [](Group& g) {
    OpSchedulerConfig oc;
    oc.credit_bytes = 256;
    oc.max_hold = absl::Seconds(30);
    auto sch = OpScheduler::Create(oc, &g);
    ASSERT_TRUE(sch.ok()) << sch.status();
    WorkPtr urgent = Work::Create(WorkInfo{"test", "urgent", 0, "gather"});
    (*sch)->TrackUrgent(urgent, 7);
    std::vector<float> x(1000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(Noise(g.rank(), i));
    std::vector<float> want = x;
    ReductionRequest r{&g,
                       CollectiveKind::kAllReduce,
                       x.data(),
                       x.data(),
                       x.size(),
                       DType::kF32,
                       ReduceOp::Sum(),
                       {},
                       0};
    auto w = (*sch)->SubmitReduction(r);
    ASSERT_TRUE(w.ok()) << w.status();
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_FALSE((*w)->Done());
    EXPECT_EQ((*sch)->partitions_issued(), 0);
    EXPECT_EQ((*sch)->holds(), 1);
    urgent->Complete(absl::OkStatus());
    ASSERT_OK((*w)->Wait(kTimeout));
    auto direct = g.AllReduce(want.data(), want.data(), want.size(), DType::kF32, ReduceOp::Sum());
    ASSERT_TRUE(direct.ok());
    ASSERT_OK((*direct)->Wait(kTimeout));
    EXPECT_EQ(0, std::memcmp(want.data(), x.data(), x.size() * sizeof(float)));
    EXPECT_EQ((*sch)->hold_expiries(), 0);
  });
}

// Hold::kWaited: an urgent operation in flight holds reductions only while a thread waits on it.
TEST(OpScheduler, WaitedPolicyHoldsOnlyWhileSomeoneWaits) {
  RunRanks(2, [](Group& g) {
    OpSchedulerConfig oc;
    oc.credit_bytes = 256;
    oc.max_hold = absl::Seconds(30);
    oc.hold = OpSchedulerConfig::Hold::kWaited;
    auto sch = OpScheduler::Create(oc, &g);
    ASSERT_TRUE(sch.ok()) << sch.status();
    WorkPtr urgent = Work::Create(WorkInfo{"test", "urgent", 0, "gather"});
    (*sch)->TrackUrgent(urgent);
    std::vector<float> x(1000, 1.0f);
    ReductionRequest r{&g,
                       CollectiveKind::kAllReduce,
                       x.data(),
                       x.data(),
                       x.size(),
                       DType::kF32,
                       ReduceOp::Sum(),
                       {},
                       0};
    auto w = (*sch)->SubmitReduction(r);  // nobody waits: not held
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(kTimeout));
    EXPECT_EQ((*sch)->holds(), 0);
    std::vector<float> y(1000, 1.0f);
    ReductionRequest r2 = r;
    r2.send = r2.recv = y.data();
    absl::StatusOr<WorkPtr> w2;
    {
      OpScheduler::WaitScope waiting(sch->get());
      w2 = (*sch)->SubmitReduction(r2);
      ASSERT_TRUE(w2.ok()) << w2.status();
      absl::SleepFor(absl::Milliseconds(50));
      EXPECT_FALSE((*w2)->Done());
      EXPECT_EQ((*sch)->holds(), 1);
    }  // the wait ends: released although the urgent work is still in flight
    ASSERT_OK((*w2)->Wait(kTimeout));
    for (float v : y) ASSERT_EQ(v, 2.0f);
    urgent->Complete(absl::OkStatus());
  });
}

// An urgent operation that does not complete holds reductions at most max_hold.
TEST(OpScheduler, HoldEndsAfterMaxHold) {
  RunRanks(2, [](Group& g) {
    OpSchedulerConfig oc;
    oc.credit_bytes = 256;
    oc.max_hold = absl::Milliseconds(50);
    auto sch = OpScheduler::Create(oc, &g);
    ASSERT_TRUE(sch.ok()) << sch.status();
    WorkPtr urgent = Work::Create(WorkInfo{"test", "urgent", 0, "gather"});
    (*sch)->TrackUrgent(urgent);
    std::vector<float> x(1000, 1.0f);
    ReductionRequest r{&g,
                       CollectiveKind::kAllReduce,
                       x.data(),
                       x.data(),
                       x.size(),
                       DType::kF32,
                       ReduceOp::Sum(),
                       {},
                       0};
    auto w = (*sch)->SubmitReduction(r);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_OK((*w)->Wait(kTimeout));
    for (float v : x) ASSERT_EQ(v, 2.0f);
    EXPECT_EQ((*sch)->hold_expiries(), 1);
    urgent->Complete(absl::OkStatus());  // before the scheduler goes (it waits for urgent work)
  });
}

TEST(OpScheduler, ConfigThatDiffersOnOneRankFailsCreateEverywhere) {
  RunRanks(3, [](Group& g) {
    OpSchedulerConfig oc;
    oc.credit_bytes = g.rank() == 2 ? 512 : 256;
    ExpectError(OpScheduler::Create(oc, &g).status(), absl::StatusCode::kFailedPrecondition,
                {"rank 2: credit_bytes=512", "rank 0: credit_bytes=256"});
  });
}

// ZeRO-3 shape: gathers on their own group tracked as urgent, reductions partitioned, several
// steps; gathered parameters and reduced shards exact.
TEST(OpScheduler, GathererAndReducerShareAScheduler) {
  RunRanks(2, [](Group& world) {
    auto gather_group = world.Split(0, world.rank(), "gather");
    ASSERT_TRUE(gather_group.ok()) << gather_group.status();
    OpSchedulerConfig oc;
    oc.credit_bytes = 512;
    oc.max_hold = absl::Seconds(30);
    auto sch = OpScheduler::Create(oc, &world);
    ASSERT_TRUE(sch.ok()) << sch.status();
    ReducerConfig rc;
    rc.mode = ReduceMode::kReduceScatter;
    rc.first_bucket_cap_bytes = 256;
    rc.bucket_cap_bytes = 4096;
    rc.timeout = kTimeout;
    rc.scheduler = sch->get();
    const std::vector<ParamSpec> params = reference::MakeParams(0);
    auto red = GradientReducer::Create(params, {&world, nullptr}, rc);
    ASSERT_TRUE(red.ok()) << red.status();
    GathererConfig gc;
    gc.timeout = kTimeout;
    gc.fully_sharded = true;
    gc.scheduler = sch->get();
    auto gat = ParamGatherer::Create((*red)->plan(), gather_group->get(), gc);
    ASSERT_TRUE(gat.ok()) << gat.status();
    const BucketPlan& plan = (*red)->plan();
    const int nb = static_cast<int>(plan.buckets().size());
    for (int b = 0; b < nb; ++b) {  // shard values: rank * 1000 + element
      auto shard = (*gat)->ShardView(b);
      ASSERT_TRUE(shard.ok());
      for (size_t i = 0; i < shard->count; ++i)
        StoreElement(shard->data, DType::kF32, i, world.rank() * 1000.0 + i);
    }
    for (int step = 0; step < 3; ++step) {
      ASSERT_OK((*red)->ZeroGrads());
      ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
      ASSERT_OK((*gat)->Prefetch(nb - 1));
      for (int b = nb - 1; b >= 0; --b) {  // "backward" walks buckets from the last
        if (b > 0) ASSERT_OK((*gat)->Prefetch(b - 1));
        ASSERT_OK((*gat)->WaitParams(b));
        const Bucket& bk = plan.buckets()[b];
        for (int p : bk.params) {
          auto pv = (*gat)->ParamView(params[p].id);
          ASSERT_TRUE(pv.ok());
          const size_t off = plan.slot(p).offset;
          for (size_t i = 0; i < pv->count; ++i) {
            const size_t pos = off + i;
            const double want =
                static_cast<double>(pos / bk.shard_count) * 1000.0 + pos % bk.shard_count;
            ASSERT_EQ(LoadElement(pv->data, DType::kF32, i), want)
                << "bucket " << b << " step " << step;
          }
          auto gv = (*red)->GradView(params[p].id);
          ASSERT_TRUE(gv.ok());
          for (size_t i = 0; i < gv->count; ++i)
            StoreElement(gv->data, DType::kF32, i, world.rank() + step + 0.25 * (i % 8));
          ASSERT_OK((*red)->MarkReady(params[p].id));
        }
        ASSERT_OK((*gat)->Release(b));
      }
      ASSERT_OK((*red)->FinishBackward());
      for (int b = 0; b < nb; ++b) {
        const Bucket& bk = plan.buckets()[b];
        TensorView s = (*red)->ShardView(b);
        for (size_t i = 0; i < s.count; ++i) {
          const size_t pos = world.rank() * bk.shard_count + i;
          // Padding stays 0; a parameter element j holds avg(rank + step + 0.25 (j % 8)).
          int p_of = -1;
          for (int p : bk.params) {
            if (pos >= plan.slot(p).offset && pos < plan.slot(p).offset + params[p].count) p_of = p;
          }
          const double want =
              p_of < 0 ? 0.0 : 0.5 + step + 0.25 * ((pos - plan.slot(p_of).offset) % 8);
          ASSERT_EQ(LoadElement(s.data, DType::kF32, i), want)
              << "bucket " << b << " step " << step;
        }
      }
    }
    EXPECT_OK((*gat)->WaitAll());
  });
}

// Each partition and its priority on the timeline, the hold, the urgent span.
TEST(OpScheduler, TimelineShowsPartitionsAndPriorities) {
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/op_sched_tl");
  RunRanks(2, [&](Group& g) {
    auto tl = Timeline::Create(prefix, g.rank());
    ASSERT_TRUE(tl.ok()) << tl.status();
    {
      OpSchedulerConfig oc;
      oc.credit_bytes = 256;
      oc.timeline = tl->get();
      auto sch = OpScheduler::Create(oc, &g);
      ASSERT_TRUE(sch.ok()) << sch.status();
      WorkPtr urgent = Work::Create(WorkInfo{"test", "urgent", 0, "gather"});
      (*sch)->TrackUrgent(urgent, 3);
      std::vector<float> x(4 * 200, 1.0f);
      ReductionRequest r{&g,
                         CollectiveKind::kReduceScatter,
                         x.data(),
                         x.data() + g.rank() * 400,
                         400,
                         DType::kF32,
                         ReduceOp::Sum(),
                         {},
                         5};
      auto w = (*sch)->SubmitReduction(r);
      ASSERT_TRUE(w.ok());
      absl::SleepFor(absl::Milliseconds(20));
      urgent->Complete(absl::OkStatus());
      ASSERT_OK((*w)->Wait(kTimeout));
    }
    ASSERT_OK((*tl)->Close());
    std::ifstream f((*tl)->path());
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string json = ss.str();
    EXPECT_NE(json.find("\"sched world\""), std::string::npos) << json.substr(0, 400);
    EXPECT_NE(json.find("reduce_scatter partition [prio 1]"), std::string::npos);
    EXPECT_NE(json.find("\"v\":5000"), std::string::npos);  // bucket 5, partition 0
    EXPECT_NE(json.find("\"v\":5001"), std::string::npos);  // bucket 5, partition 1
    EXPECT_NE(json.find("held [prio 1 behind prio 0]"), std::string::npos);
    EXPECT_NE(json.find("gather [prio 0]"), std::string::npos);
  });
}

}  // namespace
}  // namespace braid::sched
