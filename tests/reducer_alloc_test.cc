// The reducer's steady state allocates nothing: after a few warm-up backwards, further
// backwards (every mode, sync schedule, dtype path and the copy-in path, on several ranks of
// the `local` backend) make no heap allocation on any thread. This binary links the counting
// operator new of //bench:alloc_counter.
//
// A pool (WorkPool) grows only when more Works are alive at once than ever before; which thread
// drops its last reference first can move that high-water mark after warm-up, more often on a
// loaded machine (5 blocks were seen once with two builds running beside the suite on 2
// cores). The bound allows 10 such blocks over 60 backwards: any allocation made per backward
// would still cost >= 60, and before the pools every bucket cost 10+ per backward (4560 here).
#include <ostream>
#include <vector>

#include "bench/alloc_counter.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "scheduler/gradient_reducer.h"
#include "tests/multirank.h"

namespace braid::sched {
namespace {

using braid::testing::RunRanks;

constexpr int kWarmup = 8;
constexpr int kMeasured = 60;
constexpr uint64_t kMaxPoolGrowth = 10;

struct Case {
  const char* name;
  ReduceMode mode;
  int replicas, shards;
  DType dtype;
  DType reduce_dtype;
  bool views;
  std::vector<SyncMode> schedule;  // one window, repeated
  bool kept = false;               // shard_gradients: gradients passed at MarkReady, pooled storage
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<ParamSpec> Params(DType t) {
  std::vector<ParamSpec> p;
  // Odd sizes that straddle shards; ~5 buckets with the caps below.
  for (int i = 0; i < 24; ++i)
    p.push_back(ParamSpec{i, static_cast<size_t>(37 + 13 * i), t, Device::Cpu(), ""});
  return p;
}

// One accumulation window of `c`: backwards in its schedule, every parameter marked.
absl::Status Window(GradientReducer& r, const Case& c,
                    const std::vector<std::vector<char>>& grads) {
  for (SyncMode m : c.schedule) {
    RETURN_IF_ERROR(r.BeginBackward(m));
    for (int id = static_cast<int>(r.plan().params().size()) - 1; id >= 0; --id) {
      if (c.kept) {
        RETURN_IF_ERROR(r.MarkReady(id, DeviceEvent{}, grads[id].data()));
      } else {
        RETURN_IF_ERROR(r.MarkReady(id));
      }
    }
    RETURN_IF_ERROR(r.FinishBackward());
  }
  RETURN_IF_ERROR(r.ZeroGrads());
  return absl::OkStatus();
}

class ReducerAlloc : public ::testing::TestWithParam<Case> {};

TEST_P(ReducerAlloc, SteadyStateMakesNoHeapAllocation) {
  const Case c = GetParam();
  const int n = c.replicas * c.shards;
  uint64_t before = 0, after = 0;
  RunRanks(n, [&](Group& world) {
    Mesh mesh;
    ReducerGroups groups{&world, nullptr};
    if (c.mode == ReduceMode::kHybrid) {
      auto m = MakeMesh(world, c.replicas, c.shards);
      ASSERT_TRUE(m.ok()) << m.status();
      mesh = std::move(*m);
      groups = {mesh.shard.get(), mesh.replica.get()};
    }
    ReducerConfig cfg;
    cfg.mode = c.mode;
    cfg.bucket_cap_bytes = 1024;
    cfg.first_bucket_cap_bytes = 512;
    cfg.reduce_dtype = c.reduce_dtype;
    cfg.gradient_as_bucket_view = c.views;
    cfg.shard_gradients = c.kept;
    auto red = GradientReducer::Create(Params(c.dtype), groups, cfg);
    ASSERT_TRUE(red.ok()) << red.status();
    GradientReducer& r = **red;
    std::vector<std::vector<char>> ext, grads;
    for (const ParamSpec& p : r.plan().params())
      grads.emplace_back(p.count * DTypeSize(p.dtype), 0);
    if (!c.views) {
      for (const ParamSpec& p : r.plan().params()) {
        ext.emplace_back(p.count * DTypeSize(p.dtype), 1);
        ASSERT_OK(r.SetGradBuffer(p.id, ext.back().data()));
      }
    }
    for (int i = 0; i < kWarmup; ++i) ASSERT_OK(Window(r, c, grads));
    auto barrier = [&world] {
      auto w = world.Barrier();
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_OK((*w)->Wait(absl::Seconds(60)));
    };
    barrier();
    if (world.rank() == 0) before = alloc_counter::Allocs();
    barrier();
    for (int i = 0; i < kMeasured; ++i) ASSERT_OK(Window(r, c, grads));
    barrier();
    if (world.rank() == 0) after = alloc_counter::Allocs();
    barrier();
  });
  EXPECT_LE(after - before, kMaxPoolGrowth)
      << (after - before) << " heap allocations in " << kMeasured << " steady-state windows";
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ReducerAlloc,
    ::testing::Values(Case{"allreduce_f32",
                           ReduceMode::kAllReduce,
                           1,
                           2,
                           DType::kF32,
                           DType::kBF16,
                           true,
                           {SyncMode::kSync}},
                      Case{"allreduce_nosync_f16",
                           ReduceMode::kAllReduce,
                           1,
                           2,
                           DType::kF16,
                           DType::kF16,
                           true,
                           {SyncMode::kNoSync, SyncMode::kSync}},
                      Case{"allreduce_copyin_bf16_in_f32",
                           ReduceMode::kAllReduce,
                           1,
                           2,
                           DType::kBF16,
                           DType::kF32,
                           false,
                           {SyncMode::kSync}},
                      Case{"reduce_scatter_f32",
                           ReduceMode::kReduceScatter,
                           1,
                           4,
                           DType::kF32,
                           DType::kBF16,
                           true,
                           {SyncMode::kSync}},
                      Case{"hybrid_rsonly_f32",
                           ReduceMode::kHybrid,
                           2,
                           2,
                           DType::kF32,
                           DType::kBF16,
                           true,
                           {SyncMode::kReduceScatterOnly, SyncMode::kSync}},
                      Case{"hybrid_bf16",
                           ReduceMode::kHybrid,
                           2,
                           2,
                           DType::kBF16,
                           DType::kBF16,
                           true,
                           {SyncMode::kSync}},
                      Case{"reduce_scatter_kept_nosync_bf16_in_f32",
                           ReduceMode::kReduceScatter,
                           1,
                           4,
                           DType::kBF16,
                           DType::kF32,
                           true,
                           {SyncMode::kNoSync, SyncMode::kSync},
                           true},
                      Case{"hybrid_kept_rsonly_f32",
                           ReduceMode::kHybrid,
                           2,
                           2,
                           DType::kF32,
                           DType::kBF16,
                           true,
                           {SyncMode::kReduceScatterOnly, SyncMode::kSync},
                           true},
                      Case{"hybrid_kept_bf16_in_f32",
                           ReduceMode::kHybrid,
                           2,
                           2,
                           DType::kBF16,
                           DType::kF32,
                           true,
                           {SyncMode::kReduceScatterOnly, SyncMode::kNoSync, SyncMode::kSync},
                           true}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace braid::sched
