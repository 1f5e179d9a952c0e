// GradientReducer on the local backend against the serial reference (tests/reducer_reference.h):
// every mode (all-reduce, reduce-scatter, hybrid) x dtype (f32, bf16, f16, mixed) x world/mesh
// shape x random readiness orders (different on every rank, marks from two threads) x microbatch
// schedules (no_sync, reduce_scatter_only, sync) x zero-copy views or the copy-in path, with odd
// parameter sizes that straddle shards and several buckets per dtype. Bit-exact: the local
// backend reduces in group-rank order, and the reference replays each stage in that order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <thread>

#include "comm/element.h"
#include "comm/mesh.h"
#include "gtest/gtest.h"
#include "scheduler/divide.h"
#include "scheduler/gradient_reducer.h"
#include "scheduler/memory_stats.h"
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
  uint64_t z =
      ((((static_cast<uint64_t>(r) * 131 + p) * 17 + m) * 7 + s) << 32) + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;  // splitmix64
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

class ReducerVsReference : public ::testing::TestWithParam<Scenario> {};

TEST_P(ReducerVsReference, BitExact) {
  const Scenario sc = GetParam();
  RunRanks(sc.replicas * sc.shards,
           [&](Group& g) { EXPECT_OK(reference::RunScenario(g, sc, Grad, absl::Seconds(60))); });
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
      for (const char* sched : {"S", "RRS", "NRNS"})
        out.push_back({ReduceMode::kHybrid, 2, 2, dt, sched, false, true});
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

// Gradients passed at MarkReady (values) and shard_gradients: the framework's gradient of a
// microbatch is in its own dtype, so grad() returns values representable in bf16 (and f32):
// the reference's view += grad() then matches the reducer's slot += grad bit for bit.
double BF16Grad(int r, int p, int m, int s, size_t i) {
  char b[2];
  StoreElement(b, DType::kBF16, 0, Grad(r, p, m, s, i));
  return LoadElement(b, DType::kBF16, 0);
}

class ValuesVsReference : public ::testing::TestWithParam<Scenario> {};

TEST_P(ValuesVsReference, BitExact) {
  const Scenario sc = GetParam();
  RunRanks(sc.replicas * sc.shards, [&](Group& g) {
    EXPECT_OK(reference::RunScenario(g, sc, BF16Grad, absl::Seconds(60)));
  });
}

std::vector<Scenario> ValueScenarios() {
  std::vector<Scenario> out;
  for (int dt : {0, 1}) {  // f32, bf16
    for (bool kept : {false, true}) {
      auto add = [&](ReduceMode m, int reps, int shards, const char* sched, bool f32) {
        Scenario sc{m, reps, shards, dt, sched, false, f32};
        sc.values = true;
        sc.shard_gradients = kept;
        out.push_back(sc);
      };
      for (const char* sched : {"S", "NNS"}) {
        if (!kept) add(ReduceMode::kAllReduce, 1, 2, sched, false);
        add(ReduceMode::kReduceScatter, 1, 2, sched, false);
        add(ReduceMode::kReduceScatter, 1, 4, sched, false);
        if (dt == 1) add(ReduceMode::kReduceScatter, 1, 4, sched, true);
      }
      for (const char* sched : {"S", "NNS", "RRS", "NRNS", "RNRS"}) {
        add(ReduceMode::kHybrid, 2, 2, sched, false);
        if (dt == 1) add(ReduceMode::kHybrid, 2, 2, sched, true);
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Values, ValuesVsReference, ::testing::ValuesIn(ValueScenarios()),
                         [](const ::testing::TestParamInfo<Scenario>& i) {
                           return reference::ScenarioName(i.param);
                         });

// MarkReady(id, ready, grad) in plain reduce-scatter mode equals writing the same gradients
// into GradView, except that the first mark copies: a -0.0 that every rank passes survives
// (0 + -0.0 is +0.0 through the view).
TEST(MarkReadyValues, EqualsWritingIntoGradView) {
  RunRanks(4, [](Group& world) {
    ReducerConfig cfg;
    cfg.mode = ReduceMode::kReduceScatter;
    cfg.first_bucket_cap_bytes = 256;
    cfg.bucket_cap_bytes = 4096;
    const std::vector<ParamSpec> params = reference::MakeParams(1);  // bf16
    auto viewed = GradientReducer::Create(params, {&world, nullptr}, cfg);
    auto passed = GradientReducer::Create(params, {&world, nullptr}, cfg);
    ASSERT_TRUE(viewed.ok() && passed.ok()) << viewed.status() << passed.status();
    const int r = world.rank();
    const char* sched = "NNS";
    for (int m = 0; m < 3; ++m) {
      const SyncMode mode = reference::SyncModeOf(sched[m]);
      ASSERT_OK((*viewed)->BeginBackward(mode));
      ASSERT_OK((*passed)->BeginBackward(mode));
      for (size_t p = 0; p < params.size(); ++p) {
        std::vector<char> g(params[p].count * 2);
        TensorView gv{g.data(), params[p].count, DType::kBF16, Device::Cpu()};
        for (size_t i = 0; i < gv.count; ++i)
          StoreElement(g.data(), DType::kBF16, i, BF16Grad(r, p, m, 0, i));
        if (p == 2 && m == 0)
          StoreElement(g.data(), DType::kBF16, 5, -0.0);  // every rank, first mark
        TensorView v = *(*viewed)->GradView(params[p].id);
        for (size_t i = 0; i < gv.count; ++i) {
          StoreElement(v.data, DType::kBF16, i,
                       static_cast<float>(LoadElement(v.data, DType::kBF16, i)) +
                           static_cast<float>(LoadElement(g.data(), DType::kBF16, i)));
        }
        ASSERT_OK((*viewed)->MarkReady(params[p].id));
        ASSERT_OK((*passed)->MarkReady(params[p].id, DeviceEvent{}, g.data()));
      }
      ASSERT_OK((*viewed)->FinishBackward());
      ASSERT_OK((*passed)->FinishBackward());
    }
    // -0.0 only in no_sync microbatch 0 of parameter 2, element 5: later microbatches add to
    // it, so only check every other element bit for bit, and the -0.0 case separately below.
    const BucketPlan& plan = (*viewed)->plan();
    for (size_t b = 0; b < plan.buckets().size(); ++b) {
      TensorView a = (*viewed)->ShardView(static_cast<int>(b)),
                 c = (*passed)->ShardView(static_cast<int>(b));
      ASSERT_EQ(0, std::memcmp(a.data, c.data, a.count * 2)) << "bucket " << b << " rank " << r;
    }
    // A window of one synced microbatch where every rank passes -0.0.
    ASSERT_OK((*viewed)->ZeroGrads());
    ASSERT_OK((*passed)->ZeroGrads());
    ASSERT_OK((*viewed)->BeginBackward(SyncMode::kSync));
    ASSERT_OK((*passed)->BeginBackward(SyncMode::kSync));
    for (size_t p = 0; p < params.size(); ++p) {
      std::vector<char> g(params[p].count * 2);
      for (size_t i = 0; i < params[p].count; ++i) StoreElement(g.data(), DType::kBF16, i, -0.0);
      TensorView v = *(*viewed)->GradView(params[p].id);
      for (size_t i = 0; i < v.count; ++i) StoreElement(v.data, DType::kBF16, i, 0.0f + -0.0f);
      ASSERT_OK((*viewed)->MarkReady(params[p].id));
      ASSERT_OK((*passed)->MarkReady(params[p].id, DeviceEvent{}, g.data()));
    }
    ASSERT_OK((*viewed)->FinishBackward());
    ASSERT_OK((*passed)->FinishBackward());
    int negative_zeros = 0;
    for (size_t b = 0; b < plan.buckets().size(); ++b) {
      const Bucket& bk = plan.buckets()[b];
      TensorView c = (*passed)->ShardView(static_cast<int>(b));
      const size_t lo = static_cast<size_t>(r) * bk.shard_count;
      std::vector<char> in_param(bk.padded_count, 0);  // alignment gaps and padding: +0.0
      for (int p : bk.params) {
        for (size_t i = 0; i < params[p].count; ++i) in_param[plan.slot(p).offset + i] = 1;
      }
      for (size_t e = 0; e < bk.shard_count; ++e) {
        if (!in_param[lo + e]) continue;
        const double got = LoadElement(c.data, DType::kBF16, e);
        EXPECT_TRUE(got == 0 && std::signbit(got))
            << "bucket " << b << " element " << lo + e << " got " << got;
        negative_zeros += std::signbit(got) ? 1 : 0;
        EXPECT_FALSE(std::signbit(
            LoadElement((*viewed)->ShardView(static_cast<int>(b)).data, DType::kBF16, e)));
      }
    }
    EXPECT_GT(negative_zeros, 0);
  });
}

// shard_gradients's memory, exactly: four equal buckets (bf16, 2048 bytes, reduced through
// 4096-byte f32 staging), filled one at a time in bucket order, each reduced before the next
// is marked. The pool then holds exactly one bucket's storage and one staging buffer: a best
// fit hands the 2048-byte buffer to the next bucket and the 4096-byte one to its staging (a
// first fit would take the staging buffer for the bucket and grow). A no_sync microbatch keeps
// every touched bucket full-size for the window: the pool then grows to one buffer per bucket.
TEST(KeepShardsOnly, PoolHoldsOneBucketWhenFilledOneAtATime) {
  RunRanks(2, [](Group& world) {
    MemoryStats memory;
    ReducerConfig cfg;
    cfg.mode = ReduceMode::kReduceScatter;
    cfg.shard_gradients = true;
    cfg.reduce_dtype = DType::kF32;
    cfg.first_bucket_cap_bytes = 2048;
    cfg.bucket_cap_bytes = 2048;
    cfg.memory = &memory;
    std::vector<ParamSpec> params;
    for (int i = 0; i < 4; ++i)
      params.push_back(ParamSpec{i, 1024, DType::kBF16, Device::Cpu(), ""});
    auto red = GradientReducer::Create(params, {&world, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    GradientReducer& rd = **red;
    const BucketPlan& plan = rd.plan();
    ASSERT_EQ(plan.buckets().size(), 4u);
    for (const Bucket& bk : plan.buckets()) ASSERT_EQ(bk.bytes(), 2048u);
    auto use = [&](MemoryUse u) { return memory.Snapshot().by_use[static_cast<int>(u)]; };
    EXPECT_EQ(use(MemoryUse::kGradShards).current, 4 * 512 * 2);  // 4 kept bf16 shards of 512
    EXPECT_EQ(use(MemoryUse::kGradBuckets).current, 0);
    std::vector<char> g(2048);
    for (size_t i = 0; i < 1024; ++i)
      StoreElement(g.data(), DType::kBF16, i, 0.25 * (world.rank() + 1));
    for (int step = 0; step < 3; ++step) {
      ASSERT_OK(rd.BeginBackward(SyncMode::kSync));
      for (size_t b = 0; b < plan.buckets().size(); ++b) {
        for (int p : plan.buckets()[b].params)
          ASSERT_OK(rd.MarkReady(params[p].id, DeviceEvent{}, g.data()));
        ASSERT_OK(rd.BucketWork(static_cast<int>(b))->Wait(absl::Seconds(60)));
        EXPECT_EQ(use(MemoryUse::kGradBuckets).current, 2048 + 4096)
            << "step " << step << " bucket " << b;
      }
      ASSERT_OK(rd.FinishBackward());
      EXPECT_EQ(use(MemoryUse::kGradBuckets).peak, 2048 + 4096);
      EXPECT_EQ(use(MemoryUse::kGradShards).current, 4 * 512 * 2);
      for (size_t b = 0; b < 4; ++b) {  // the average of 0.25 and 0.5
        TensorView v = rd.ShardView(static_cast<int>(b));
        for (size_t e = 0; e < v.count; ++e) ASSERT_EQ(LoadElement(v.data, DType::kBF16, e), 0.375);
        ASSERT_OK(rd.ZeroBucket(static_cast<int>(b)));  // the optimizer consumed it
        EXPECT_EQ(LoadElement(v.data, DType::kBF16, 0), 0.0);
      }
      EXPECT_EQ(use(MemoryUse::kGradBuckets).current, 2048 + 4096);  // ZeroBucket took nothing
    }
    // no_sync: every bucket stays full-size until the synced backward (FSDP's no_sync cost).
    ASSERT_OK(rd.BeginBackward(SyncMode::kNoSync));
    for (const ParamSpec& p : params) ASSERT_OK(rd.MarkReady(p.id, DeviceEvent{}, g.data()));
    ASSERT_OK(rd.FinishBackward());
    // Bucket 0 takes the free 2048-byte buffer, buckets 1-3 new ones; the free 4096-byte one
    // stays for the f32 staging (reuse is by equal size only: the pool never outgrows every
    // bucket's storage and staging once, whatever the timing).
    EXPECT_EQ(use(MemoryUse::kGradBuckets).current, 4 * 2048 + 4096);
    ASSERT_OK(rd.BeginBackward(SyncMode::kSync));
    for (const ParamSpec& p : params) ASSERT_OK(rd.MarkReady(p.id, DeviceEvent{}, g.data()));
    ASSERT_OK(rd.FinishBackward());
    TensorView v = rd.ShardView(0);
    EXPECT_EQ(LoadElement(v.data, DType::kBF16, 0), 0.75);
  });
}

TEST(KeepShardsOnly, RefusesWhatItCannotDo) {
  RunRanks(2, [](Group& world) {
    const std::vector<ParamSpec> params = reference::MakeParams(0);
    ReducerConfig cfg;
    cfg.shard_gradients = true;
    auto ar = GradientReducer::Create(params, {&world, nullptr}, cfg);  // all-reduce
    EXPECT_EQ(ar.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ar.status().message().find("reduce-scatter or hybrid"), std::string::npos)
        << ar.status();
    cfg.mode = ReduceMode::kReduceScatter;
    cfg.rebuild_bucket_order = true;
    EXPECT_EQ(GradientReducer::Create(params, {&world, nullptr}, cfg).status().code(),
              absl::StatusCode::kInvalidArgument);
    cfg.rebuild_bucket_order = false;
    cfg.gradient_as_bucket_view = false;
    EXPECT_EQ(GradientReducer::Create(params, {&world, nullptr}, cfg).status().code(),
              absl::StatusCode::kInvalidArgument);
    cfg.gradient_as_bucket_view = true;
    cfg.allow_unused = true;
    auto red = GradientReducer::Create(params, {&world, nullptr}, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    auto view = (*red)->GradView(params[1].id);
    EXPECT_EQ(view.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(view.status().message().find("passed at braid_reducer_mark_ready_grad"),
              std::string::npos)
        << view.status();
    ASSERT_OK((*red)->BeginBackward(SyncMode::kSync));
    const absl::Status plain = (*red)->MarkReady(params[1].id);
    EXPECT_EQ(plain.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(plain.message().find("layer1.weight"), std::string::npos) << plain;
    // allow_unused: nothing marked at all, every kept shard is zero.
    ASSERT_OK((*red)->FinishBackward());
    for (size_t b = 0; b < (*red)->plan().buckets().size(); ++b) {
      TensorView v = (*red)->ShardView(static_cast<int>(b));
      for (size_t e = 0; e < v.count; ++e) ASSERT_EQ(LoadElement(v.data, v.dtype, e), 0.0);
    }
  });
}

}  // namespace
}  // namespace braid::sched
