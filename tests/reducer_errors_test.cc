// GradientReducer misuse and failures: each is an error naming the parameter, bucket or group;
// nothing hangs; unused parameters are zero-filled and reduced only when allowed.
#include <algorithm>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "comm/mesh.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/timeline.h"
#include "tests/multirank.h"
#include "tests/reducer_unused_checks.h"

namespace braid::sched {
namespace {

using braid::testing::LocalOptions;
using braid::testing::RunRanks;

using braid::testing::ExpectError;
using testing::TwoParams;

TEST(ReducerErrors, MarksOutsideBackwardUnknownAndTwice) {
  RunRanks(2, [](Group& g) {
    auto red = GradientReducer::Create(TwoParams(), {&g, nullptr}, ReducerConfig{});
    ASSERT_TRUE(red.ok()) << red.status();
    ExpectError((*red)->MarkReady(1), absl::StatusCode::kFailedPrecondition,
                {"'fc.weight' (id 1)", "outside a backward"});
    ExpectError((*red)->FinishBackward(), absl::StatusCode::kFailedPrecondition,
                {"no backward in progress", "braid_reducer_begin_backward"});
    ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
    ExpectError((*red)->BeginBackward(SyncMode::kSync), absl::StatusCode::kFailedPrecondition,
                {"not finished"});
    ExpectError((*red)->MarkReady(99), absl::StatusCode::kNotFound, {"id 99"});
    ASSERT_OK((*red)->MarkReady(2));
    ExpectError((*red)->MarkReady(2), absl::StatusCode::kFailedPrecondition,
                {"'fc.bias' (id 2)", "already marked"});
    ASSERT_OK((*red)->MarkReady(1));
    ASSERT_OK((*red)->FinishBackward());
    ExpectError((*red)->BeginBackward(SyncMode::kReduceScatterOnly),
                absl::StatusCode::kInvalidArgument, {"reduce_scatter_only", "hybrid"});
  });
}

TEST(ReducerErrors, BadParametersAreNamed) {
  RunRanks(1, [](Group& g) {
    auto ints = TwoParams();
    ints[1].dtype = DType::kI32;
    ExpectError(GradientReducer::Create(ints, {&g, nullptr}, ReducerConfig{}).status(),
                absl::StatusCode::kInvalidArgument, {"'fc.bias'", "floating", "i32"});
    auto gpu = TwoParams();
    gpu[0].device = Device::Cuda(0);
    ExpectError(GradientReducer::Create(gpu, {&g, nullptr}, ReducerConfig{}).status(),
                absl::StatusCode::kUnimplemented, {"'fc.weight'", "cuda:0"});
    ReducerConfig hybrid;
    hybrid.mode = ReduceMode::kHybrid;
    ExpectError(GradientReducer::Create(TwoParams(), {&g, nullptr}, hybrid).status(),
                absl::StatusCode::kInvalidArgument, {"replica group"});
  });
}

TEST(ReducerErrors, CopyInPathMisuse) {
  RunRanks(1, [](Group& g) {
    auto views = GradientReducer::Create(TwoParams(), {&g, nullptr}, ReducerConfig{});
    ASSERT_TRUE(views.ok());
    float buf[8];
    ExpectError((*views)->SetGradBuffer(1, buf), absl::StatusCode::kFailedPrecondition,
                {"'fc.weight'", "bucket views"});
    ReducerConfig cfg;
    cfg.gradient_as_bucket_view = false;
    auto copy = GradientReducer::Create(TwoParams(), {&g, nullptr}, cfg);
    ASSERT_TRUE(copy.ok());
    ASSERT_OK((*copy)->SetGradBuffer(1, buf));
    ExpectError((*copy)->SetGradBuffer(2, nullptr), absl::StatusCode::kInvalidArgument,
                {"'fc.bias'", "null"});
    ExpectError((*copy)->BeginBackward(SyncMode::kSync), absl::StatusCode::kFailedPrecondition,
                {"'fc.bias' (id 2)", "braid_reducer_set_grad_buffer"});
    ExpectError((*copy)->SetGradBuffer(7, buf), absl::StatusCode::kNotFound, {"id 7"});
  });
}

TEST(ReducerErrors, PlanThatDiffersOnOneRankFailsCreateEverywhere) {
  RunRanks(3, [](Group& g) {
    auto params = TwoParams();
    if (g.rank() == 1) params[0].count = 9;
    ExpectError(GradientReducer::Create(params, {&g, nullptr}, ReducerConfig{}).status(),
                absl::StatusCode::kFailedPrecondition, {"'fc.weight'", "rank 1"});
  });
}

TEST(ReducerUnused, ReportedByNameUnlessAllowed) {
  RunRanks(2, [](Group& g) { testing::CheckUnusedReportedByName(g, ReducerConfig{}); });
}

TEST(ReducerUnused, ZeroFilledAndReducedWhenAllowedButNoSyncSumsAreKept) {
  RunRanks(2,
           [](Group& g) { testing::CheckUnusedZeroFilledButNoSyncSumsKept(g, ReducerConfig{}); });
}

TEST(ReducerErrors, StalledPeerFailsFinishBackwardNamingBucketAndGroup) {
  auto backend = CreateBackend(LocalOptions(2, absl::Milliseconds(300)));
  ASSERT_TRUE(backend.ok());
  RunRanks(**backend, [](Group& g) {
    ReducerConfig cfg;
    cfg.timeout = absl::Seconds(20);
    auto red = GradientReducer::Create(TwoParams(), {&g, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
    if (g.rank() == 0) {  // rank 1 never marks anything: its collectives never start
      ASSERT_OK((*red)->MarkReady(1));
      ASSERT_OK((*red)->MarkReady(2));
      ExpectError((*red)->FinishBackward(), absl::StatusCode::kDeadlineExceeded,
                  {"allreduce #", "'world'", "(bucket 0)", "rank(s) 1 did not arrive"});
    }
  });
}

// Fuzz finding 10 (docs/hardening.md): a backward whose wait fails at the reducer's deadline
// leaves its collectives in flight (here rank 1 sleeps 2 s inside its copy of bucket 0's
// all-reduce); they still read and write the buckets. The next backward, a re-plan and zeroing
// must not reuse that storage, and destroying the reducer must leak it, not free it.
class InFlightBackward {
 public:
  // The first collective of the backward started next on `g` has rank 1 stall in its copy.
  static void StallRankOnesNextCollective(local::LocalBackend& b, Group& g) {
    auto first = g.Barrier();
    ASSERT_TRUE(first.ok());
    ASSERT_OK((*first)->Wait(absl::Seconds(30)));
    if (g.rank() == 0) b.faults().StallRankInCopy(1, (*first)->info().seq + 2, kStall, "world");
    auto second = g.Barrier();  // the fault is in place before either rank launches
    ASSERT_TRUE(second.ok());
    ASSERT_OK((*second)->Wait(absl::Seconds(30)));
  }
  // A backward of TwoParams() whose wait ends at the reducer's deadline, bucket 0 in flight.
  static void LeaveInFlight(GradientReducer& r) {
    ASSERT_OK(r.BeginBackward(SyncMode::kSync));
    ASSERT_OK(r.MarkReady(2));
    ASSERT_OK(r.MarkReady(1));
    ExpectError(r.FinishBackward(), absl::StatusCode::kDeadlineExceeded, {"bucket 0"});
    ExpectError(r.BeginBackward(SyncMode::kSync), absl::StatusCode::kFailedPrecondition,
                {"braid_reducer_begin_backward", "bucket 0's reduction", "still in flight"});
    ExpectError(r.Replan(1 << 20, 1 << 20).status(), absl::StatusCode::kFailedPrecondition,
                {"re-planning the buckets", "bucket 0's reduction", "still in flight"});
    ExpectError(r.ZeroGrads(), absl::StatusCode::kFailedPrecondition,
                {"zeroing gradients", "bucket 0's reduction", "still in flight"});
  }
  static ReducerConfig Config() {
    ReducerConfig cfg;
    cfg.timeout = absl::Milliseconds(150);  // far below the stall
    cfg.first_bucket_cap_bytes = 16;        // two buckets: the bias, then the weight
    return cfg;
  }
  static constexpr absl::Duration kStall = absl::Seconds(2);

  // On 2 local ranks: a reducer of TwoParams() left with bucket 0 in flight, then `then`.
  static void Run(const std::function<void(Group&, std::unique_ptr<GradientReducer>&)>& then) {
    auto backend = CreateBackend(LocalOptions(2));
    ASSERT_TRUE(backend.ok());
    auto& local = static_cast<local::LocalBackend&>(**backend);
    RunRanks(local, [&](Group& g) {
      auto red = GradientReducer::Create(TwoParams(), {&g, nullptr}, Config());
      ASSERT_TRUE(red.ok()) << red.status();
      StallRankOnesNextCollective(local, g);
      LeaveInFlight(**red);
      if (::testing::Test::HasFatalFailure()) return;
      then(g, *red);
    });
  }
};

TEST(ReducerErrors, ABackwardLeftInFlightRefusesTheNextUntilItCompletes) {
  InFlightBackward::Run([](Group& g, std::unique_ptr<GradientReducer>& red) {
    GradientReducer& r = *red;
    // Once the stalled collective completed, the reducer is usable again and reduces right.
    absl::Status begin;
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while (!(begin = r.BeginBackward(SyncMode::kSync)).ok() && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    ASSERT_OK(begin);
    for (ParamId id : {1, 2}) {
      TensorView v = *r.GradView(id);
      std::fill_n(static_cast<float*>(v.data), v.count, 1.0f + g.rank());
    }
    ASSERT_OK(r.MarkReady(2));
    ASSERT_OK(r.MarkReady(1));
    ASSERT_OK(r.FinishBackward());
    for (ParamId id : {1, 2}) {
      TensorView v = *r.GradView(id);
      const float* d = static_cast<const float*>(v.data);
      EXPECT_TRUE(std::all_of(d, d + v.count, [](float x) { return x == 1.5f; })) << id;
    }
  });
}

TEST(ReducerErrors, DestroyedWithABackwardInFlightLeaksItsStorage) {
  InFlightBackward::Run([](Group& g, std::unique_ptr<GradientReducer>& red) {
    red.reset();  // waits its 150 ms, then leaks the buckets still in flight
    // The stalled rank now reads rank 0's bucket and the collectives complete, their callbacks
    // reaching no freed reducer (under ASan any of it would be a use after free).
    auto after = g.Barrier();
    ASSERT_TRUE(after.ok());
    ASSERT_OK((*after)->Wait(absl::Seconds(30)));
  });
}

// With a timeline, each rank's trace shows the marks, the launches, each bucket's collective on
// its group's row (both rows in hybrid mode) and the wait.
TEST(ReducerTimeline, TraceShowsMarksLaunchesCollectivesAndWaits) {
  const std::string prefix = absl::StrCat(::testing::TempDir(), "/reducer_trace");
  RunRanks(4, [&](Group& g) {
    auto tl = Timeline::Create(prefix, g.rank());
    ASSERT_TRUE(tl.ok()) << tl.status();
    auto mesh = MakeMesh(g, 2, 2);
    ASSERT_TRUE(mesh.ok());
    ReducerConfig cfg;
    cfg.mode = ReduceMode::kHybrid;
    cfg.timeline = tl->get();
    auto red = GradientReducer::Create(TwoParams(), {mesh->shard.get(), mesh->replica.get()}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
    ASSERT_OK((*red)->MarkReady(2));
    ASSERT_OK((*red)->MarkReady(1));
    ASSERT_OK((*red)->FinishBackward());
    red->reset();
    ASSERT_OK((*tl)->Close());
    std::ifstream in((*tl)->path());
    const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const char* part : {"\"mark\"", "\"launch\"", "\"reduce_scatter\"",
                             "\"allreduce (replicas)\"", "\"finish_backward wait\"",
                             "group world/shard", "group world/replica", "bucket launches"}) {
      EXPECT_NE(json.find(part), std::string::npos) << part << " missing from " << (*tl)->path();
    }
  });
}

// The one-time rebuild adopts world rank 0's readiness order on every rank, keeps gradient
// values, and later backwards reduce correctly in the new layout.
TEST(ReducerRebuild, AdoptsRankZerosOrderAndKeepsGradients) {
  for (ReduceMode mode : {ReduceMode::kAllReduce, ReduceMode::kHybrid}) {
    RunRanks(4, [mode](Group& g) {
      std::vector<ParamSpec> params;
      for (int i = 0; i < 6; ++i) {
        params.push_back(ParamSpec{10 + i, static_cast<size_t>(5 + 7 * i), DType::kF32,
                                   Device::Cpu(), absl::StrCat("p", i)});
      }
      Mesh mesh;
      ReducerGroups groups{&g, nullptr};
      if (mode == ReduceMode::kHybrid) {
        auto m = MakeMesh(g, 2, 2);
        ASSERT_TRUE(m.ok());
        mesh = std::move(*m);
        groups = {mesh.shard.get(), mesh.replica.get()};
      }
      ReducerConfig cfg;
      cfg.mode = mode;
      cfg.first_bucket_cap_bytes = 64;
      cfg.bucket_cap_bytes = 256;
      cfg.rebuild_bucket_order = true;
      auto red = GradientReducer::Create(params, groups, cfg);
      ASSERT_TRUE(red.ok()) << red.status();
      GradientReducer& r = **red;
      EXPECT_EQ(r.plan().buckets()[0].params.front(), 5);  // reverse registration order at first
      auto fill_and_mark = [&](std::vector<int> order) {
        ASSERT_OK(r.BeginBackward(SyncMode::kSync));
        for (int p : order) {
          TensorView v = *r.GradView(params[p].id);
          for (size_t e = 0; e < v.count; ++e)
            static_cast<float*>(v.data)[e] = (g.rank() + 1.0f) * (p + 1);
          ASSERT_OK(r.MarkReady(params[p].id));
        }
        ASSERT_OK(r.FinishBackward());
      };
      std::vector<int> order = {0, 1, 2, 3, 4, 5};
      if (g.rank() != 0) std::shuffle(order.begin(), order.end(), std::mt19937(g.rank()));
      fill_and_mark(order);
      std::vector<std::vector<float>> before;
      for (const ParamSpec& p : params) {
        TensorView v = *r.GradView(p.id);
        before.emplace_back(static_cast<float*>(v.data), static_cast<float*>(v.data) + v.count);
      }
      auto rebuilt = r.RebuildBucketsIfPending();
      ASSERT_TRUE(rebuilt.ok()) << rebuilt.status();
      EXPECT_TRUE(*rebuilt);
      EXPECT_EQ(r.plan_generation(), 1);
      EXPECT_EQ(r.plan().buckets()[0].params.front(), 0);  // rank 0 marked parameter 0 first
      for (size_t p = 0; p < params.size(); ++p) {
        TensorView v = *r.GradView(params[p].id);
        EXPECT_TRUE(std::equal(before[p].begin(), before[p].end(), static_cast<float*>(v.data)))
            << p;
      }
      EXPECT_FALSE(*r.RebuildBucketsIfPending());  // one time only
      ASSERT_OK(r.ZeroGrads());
      fill_and_mark({5, 3, 1, 0, 2, 4});
      if (mode == ReduceMode::kAllReduce) {
        for (size_t p = 0; p < params.size(); ++p) {
          TensorView v = *r.GradView(params[p].id);
          for (size_t e = 0; e < v.count; ++e) {
            ASSERT_EQ(static_cast<float*>(v.data)[e], 2.5f * (p + 1))
                << p;  // avg of 1..4 times p+1
          }
        }
      }
    });
  }
}

}  // namespace
}  // namespace braid::sched
