// Fully sharded training end to end (ZeRO-3 / FSDP) on the `local` backend: the reducer keeping
// only gradient shards (copied in at mark time), the gatherer holding parameters only as shards
// between uses, the sharded optimizer writing shards without gathering, and the unit scheduler
// gathering, releasing and prefetching units in forward and backward. Every forward reads each
// unit's parameters and compares them bit for bit with the serial AdamW / SGD reference of
// tests/optim/optimizer_harness (exact gradients, power-of-two worlds), over reduce-scatter on
// 2 ranks and hybrid 2 x 2, f32 and bf16, with sync, no_sync and reduce_scatter_only
// accumulation, one parameter group or two of different hyper-parameters; memory is checked from
// the accounting after every step (nothing gathered, no full gradient bucket held beyond the pool,
// the kept shards exactly the shard bytes).
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "scheduler/memory_stats.h"
#include "scheduler/reducer_storage.h"
#include "scheduler/unit_scheduler.h"
#include "tests/multirank.h"
#include "tests/optim/optimizer_harness.h"

namespace braid::optim::testing {
namespace {

using braid::testing::RunRanks;
using sched::MemoryUse;

constexpr int kUnits = 4;

struct FsdpCase {
  std::string name;
  OptScenario s;
  bool reshard_after_forward = true;
  int prefetch = 1;
  bool shared_pool = false;  // one BufferPool for gathered parameters and gradient storage
  // With shared_pool: its limit, in units' bytes (equal units, one bucket each; 0: none).
  int pool_limit_units = 0;
};

void PrintTo(const FsdpCase& c, std::ostream* os) { *os << c.name; }

int UnitOf(int i, int params) { return i * kUnits / params; }

// One rank's fully sharded stack. Members are destroyed in reverse.
struct FsdpStack {
  sched::MemoryStats memory;
  std::shared_ptr<sched::BufferPool> pool;  // shared_pool cases
  Mesh mesh;
  std::unique_ptr<Group> gather_group;
  std::unique_ptr<sched::GradientReducer> reducer;
  std::unique_ptr<sched::ParamGatherer> gatherer;
  std::unique_ptr<ShardedOptimizer> opt;
  std::unique_ptr<sched::UnitScheduler> units;
};

absl::StatusOr<std::unique_ptr<FsdpStack>> Build(Group& world, const FsdpCase& c) {
  const OptScenario& s = c.s;
  auto st = std::make_unique<FsdpStack>();
  sched::ReducerConfig rc;
  rc.bucket_cap_bytes = s.bucket_cap_bytes;
  rc.first_bucket_cap_bytes = s.bucket_cap_bytes / 2;
  rc.timeout = absl::Seconds(60);
  rc.memory = &st->memory;
  rc.shard_gradients = true;
  if (c.pool_limit_units > 0) {
    // Equal units of one bucket each (all the first bucket's size too): one pool key.
    rc.first_bucket_cap_bytes = s.bucket_cap_bytes;
    const size_t unit =
        s.counts[0] * static_cast<size_t>(s.counts.size() / kUnits) * DTypeSize(s.dtype);
    st->pool = std::make_shared<sched::BufferPool>(sched::BufferPool::Options{
        c.pool_limit_units * static_cast<int64_t>(sched::AlignedStorageBytes(unit)), &st->memory});
  } else if (c.shared_pool) {
    st->pool = std::make_shared<sched::BufferPool>();
  }
  rc.shared_pool = st->pool;
  sched::ReducerGroups groups;
  if (s.replicas > 1) {
    ASSIGN_OR_RETURN(st->mesh, MakeMesh(world, s.replicas, s.shards));
    rc.mode = sched::ReduceMode::kHybrid;
    groups = {st->mesh.shard.get(), st->mesh.replica.get()};
  } else {
    rc.mode = sched::ReduceMode::kReduceScatter;
    groups = {&world, nullptr};
  }
  const int P = static_cast<int>(s.counts.size());
  std::vector<sched::ParamSpec> specs;
  for (int i = 0; i < P; ++i) {
    sched::ParamSpec p{i, s.counts[i], s.dtype, Device::Cpu(), absl::StrCat("p", i)};
    p.unit = UnitOf(i, P);
    specs.push_back(p);
  }
  ASSIGN_OR_RETURN(st->reducer, sched::GradientReducer::Create(specs, groups, rc));
  ASSIGN_OR_RETURN(st->gather_group, groups.shard->Split(0, groups.shard->rank(), "gather"));
  sched::GathererConfig gc;
  gc.timeout = absl::Seconds(60);
  gc.fully_sharded = true;
  gc.memory = &st->memory;
  gc.shared_pool = st->pool;
  ASSIGN_OR_RETURN(st->gatherer,
                   sched::ParamGatherer::Create(st->reducer->plan(), st->gather_group.get(), gc));
  OptimizerConfig oc = s.opt;
  oc.timeout = absl::Seconds(60);
  oc.memory = &st->memory;
  oc.fully_sharded = true;
  ASSIGN_OR_RETURN(st->opt, ShardedOptimizer::Create(st->reducer.get(), st->gatherer.get(), oc));
  for (int i = 0; i < P; ++i) {
    std::vector<uint8_t> init(s.counts[i] * DTypeSize(s.dtype));
    for (size_t j = 0; j < s.counts[i]; ++j)
      StoreElement(init.data(), s.dtype, j, InitialValue(i, j));
    RETURN_IF_ERROR(st->opt->SetParam(i, init.data()));
  }
  sched::UnitConfig uc;
  uc.timeout = absl::Seconds(60);
  uc.prefetch = c.prefetch;
  uc.reshard_after_forward = c.reshard_after_forward;
  uc.memory = &st->memory;
  ShardedOptimizer* opt = st->opt.get();
  uc.before_gather = [opt](int b, DeviceEvent* ready) { return opt->WaitShard(b, ready); };
  ASSIGN_OR_RETURN(st->units, sched::UnitScheduler::Create(st->gatherer.get(), uc));
  return st;
}

// Forward through every unit: each parameter equals the reference after `t` steps.
absl::Status Forward(FsdpStack& st, const OptScenario& s, int t, int rank) {
  const std::vector<std::vector<uint8_t>> want = ReferenceParams(s, t);
  const int P = static_cast<int>(s.counts.size());
  for (int u = 0; u < kUnits; ++u) {
    RETURN_IF_ERROR(st.units->BeginForward(u));
    for (int i = 0; i < P; ++i) {
      if (UnitOf(i, P) != u) continue;
      ASSIGN_OR_RETURN(TensorView v, st.gatherer->ParamView(i));
      if (std::memcmp(v.data, want[i].data(), want[i].size()) != 0) {
        return absl::InternalError(absl::StrCat("rank ", rank, ": parameter ", i, " (unit ", u,
                                                ") differs from the reference after ", t,
                                                " steps"));
      }
    }
    RETURN_IF_ERROR(st.units->EndForward(u));
  }
  return absl::OkStatus();
}

// One microbatch's backward: units last to first, each unit's gradients handed over in a
// random order (per rank and step).
absl::Status Backward(FsdpStack& st, const OptScenario& s, int t, int mb, int rank) {
  const int P = static_cast<int>(s.counts.size());
  RETURN_IF_ERROR(st.opt->BeginBackward(s.schedule[mb]));
  std::mt19937 rng(1000 * rank + 10 * t + mb);
  std::vector<uint8_t> grad;
  for (int u = kUnits - 1; u >= 0; --u) {
    RETURN_IF_ERROR(st.units->BeginBackward(u));
    std::vector<int> ids;
    for (int i = 0; i < P; ++i) {
      if (UnitOf(i, P) == u) ids.push_back(i);
    }
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int i : ids) {
      grad.assign(s.counts[i] * DTypeSize(s.dtype), 0);
      for (size_t j = 0; j < s.counts[i]; ++j)
        StoreElement(grad.data(), s.dtype, j, Grad(rank, t, mb, i, j, s));
      RETURN_IF_ERROR(st.reducer->MarkReady(i, DeviceEvent{}, grad.data()));
      std::fill(grad.begin(), grad.end(),
                0xff);  // the reducer copied it: scribbling must not matter
    }
    RETURN_IF_ERROR(st.units->EndBackward(u));
  }
  return st.opt->FinishBackward();
}

// After a step: every gather released (the gather buffers left are the gatherer's pool of
// free ones, and the accounting says exactly that), the live bytes never above 2 x the largest
// unit (the default limit), the kept gradient shards and parameter shards exactly one shard per
// bucket.
absl::Status CheckMemory(FsdpStack& st, const FsdpCase& c, int rank, int t) {
  const sched::MemorySnapshot m = st.memory.Snapshot();
  const auto current = [&](MemoryUse u) { return m.by_use[static_cast<int>(u)].current; };
  const sched::BucketPlan& plan = st.reducer->plan();
  int64_t shards = 0, largest_unit = 0;
  for (const sched::Bucket& b : plan.buckets())
    shards += static_cast<int64_t>(b.shard_count * DTypeSize(b.dtype));
  for (int u = 0; u < plan.num_units(); ++u) {
    int64_t bytes = 0;
    for (int b : plan.UnitBuckets(u)) bytes += static_cast<int64_t>(plan.buckets()[b].bytes());
    largest_unit = std::max(largest_unit, bytes);
  }
  const std::string at = absl::StrCat("rank ", rank, " step ", t, ": ");
  if (st.units->live_bytes() != 0 || st.gatherer->held_bytes() != 0) {
    return absl::InternalError(absl::StrCat(at, st.units->live_bytes(),
                                            " gathered bytes not released (",
                                            st.gatherer->held_bytes(), " held)"));
  }
  if (st.pool !=
      nullptr) {  // every free full-size buffer, gathered or gradient, is in the shared pool
    const int64_t full = current(MemoryUse::kParamGather) + current(MemoryUse::kGradBuckets);
    if (full != st.pool->free_bytes()) {
      return absl::InternalError(absl::StrCat(at, full, " full-size bytes counted, ",
                                              st.pool->free_bytes(), " free in the shared pool"));
    }
  } else if (current(MemoryUse::kParamGather) !=
             static_cast<int64_t>(st.gatherer->pooled_bytes())) {
    return absl::InternalError(absl::StrCat(at, current(MemoryUse::kParamGather),
                                            " gather bytes counted, ", st.gatherer->pooled_bytes(),
                                            " pooled"));
  }
  // Kept from forward to backward, every unit is gathered at the end of the forward: the
  // limit holds only for prefetches then.
  int64_t all = 0;
  for (const sched::Bucket& b : plan.buckets()) all += static_cast<int64_t>(b.bytes());
  const int64_t bound = c.reshard_after_forward ? 2 * largest_unit : all;
  if (st.units->peak_live_bytes() > bound) {
    return absl::InternalError(absl::StrCat(at, "peak live gathered bytes ",
                                            st.units->peak_live_bytes(), " above ", bound));
  }
  if (st.pool != nullptr && st.pool->limit_bytes() > 0 &&
      (st.pool->peak_held_bytes() > st.pool->limit_bytes() || m.pool_over_limit != 0)) {
    return absl::InternalError(absl::StrCat(
        at, "the pool held ", st.pool->peak_held_bytes(), " bytes at most (", m.pool_over_limit,
        " growths past its limit of ", st.pool->limit_bytes(), ")"));
  }
  if (current(MemoryUse::kParamShards) != shards) {
    return absl::InternalError(absl::StrCat(at, current(MemoryUse::kParamShards),
                                            " parameter shard bytes, want ", shards));
  }
  if (current(MemoryUse::kGradShards) <
      shards) {  // hybrid with an f32 reduce dtype keeps an f32 one too
    return absl::InternalError(absl::StrCat(at, current(MemoryUse::kGradShards),
                                            " gradient shard bytes, want >= ", shards));
  }
  return absl::OkStatus();
}

absl::Status RunCase(Group& world, const FsdpCase& c) {
  ASSIGN_OR_RETURN(auto st, Build(world, c));
  for (int t = 0; t < c.s.steps; ++t) {
    for (int mb = 0; mb < static_cast<int>(c.s.schedule.size()); ++mb) {
      RETURN_IF_ERROR(Forward(*st, c.s, t, world.rank()));
      RETURN_IF_ERROR(Backward(*st, c.s, t, mb, world.rank()));
      RETURN_IF_ERROR(st->units->EndStep());  // after every forward + backward pass
    }
    RETURN_IF_ERROR(st->opt->WaitAllParams());
    RETURN_IF_ERROR(CheckMemory(*st, c, world.rank(), t));
  }
  return Forward(*st, c.s, c.s.steps, world.rank());
}

// Save after 2 steps, load into a fresh stack (its layout sections carry the units: a plan
// with units must reproduce its fingerprint), one more step: the reference after 3.
TEST(FullyShardedResume, LoadedStateContinuesBitExact) {
  FsdpCase c{"resume", OptScenario{}};
  c.s.steps = 3;
  const std::string dir = ::testing::TempDir();
  RunRanks(2, [&](Group& world) {
    const std::string path = absl::StrCat(dir, "/fsdp_resume_rank", world.rank(), ".braid");
    {
      auto st = Build(world, c);
      ASSERT_TRUE(st.ok()) << st.status();
      for (int t = 0; t < 2; ++t) {
        ASSERT_OK(Forward(**st, c.s, t, world.rank()));
        ASSERT_OK(Backward(**st, c.s, t, 0, world.rank()));
        ASSERT_OK((*st)->units->EndStep());
      }
      ASSERT_OK((*st)->opt->WaitAllParams());
      ASSERT_OK((*st)->opt->Save(path));
    }
    auto st = Build(world, c);
    ASSERT_TRUE(st.ok()) << st.status();
    ASSERT_OK((*st)->opt->Load(path));
    ASSERT_OK(Forward(**st, c.s, 2, world.rank()));
    ASSERT_OK(Backward(**st, c.s, 2, 0, world.rank()));
    ASSERT_OK((*st)->units->EndStep());
    ASSERT_OK((*st)->opt->WaitAllParams());
    ASSERT_OK(Forward(**st, c.s, 3, world.rank()));
  });
}

class FullyShardedTest : public ::testing::TestWithParam<FsdpCase> {};

TEST_P(FullyShardedTest, MatchesSerialReference) {
  const FsdpCase& c = GetParam();
  RunRanks(c.s.replicas * c.s.shards, [&](Group& world) { ASSERT_OK(RunCase(world, c)); });
}

std::vector<FsdpCase> Cases() {
  std::vector<FsdpCase> out;
  for (int replicas : {1, 2}) {
    for (DType d : {DType::kF32, DType::kBF16}) {
      OptScenario s;
      s.replicas = replicas;
      s.shards = 2;
      s.dtype = d;
      s.steps = 3;
      const std::string base = absl::StrCat(replicas > 1 ? "hybrid2x2_" : "rs2_", DTypeName(d));
      out.push_back({base + "_sync", s});
      s.schedule = {sched::SyncMode::kNoSync, sched::SyncMode::kSync};
      out.push_back({base + "_no_sync", s});
      if (replicas > 1) {
        s.schedule = {sched::SyncMode::kReduceScatterOnly, sched::SyncMode::kSync};
        out.push_back({base + "_rs_only", s});
      }
    }
  }
  FsdpCase keep{"rs2_f32_keep_after_forward", OptScenario{}, false, 1};
  keep.s.steps = 3;
  out.push_back(keep);
  FsdpCase noprefetch{"rs2_f32_no_prefetch", OptScenario{}, true, 0};
  noprefetch.s.steps = 3;
  out.push_back(noprefetch);
  for (int replicas : {1, 2}) {
    FsdpCase shared{replicas > 1 ? "hybrid2x2_bf16_shared_pool" : "rs2_f32_shared_pool",
                    OptScenario{}, true, 1, true};
    shared.s.replicas = replicas;
    shared.s.steps = 3;
    if (replicas > 1) {
      shared.s.dtype = DType::kBF16;
      shared.s.schedule = {sched::SyncMode::kReduceScatterOnly, sched::SyncMode::kSync};
    }
    out.push_back(shared);
  }
  // A bounded shared pool (backpressure, scheduler/buffer_pool.h): 4 equal units, at most 3
  // units' buffers (gathered and gradient storage together), with and without prefetch.
  for (int prefetch : {1, 0}) {
    FsdpCase bounded{prefetch ? "rs2_f32_pool_limit" : "rs2_f32_pool_limit_no_prefetch",
                     OptScenario{},
                     true,
                     prefetch,
                     true,
                     3};
    bounded.s.steps = 3;
    bounded.s.counts = std::vector<size_t>(8, 256);
    bounded.s.bucket_cap_bytes = 2 * 256 * 4;
    out.push_back(bounded);
  }
  FsdpCase sgd{"rs2_sgd", OptScenario{}, true, 1};
  sgd.s.steps = 3;
  sgd.s.opt.kind = OptimizerKind::kSgd;
  sgd.s.opt.groups[0].sgd.lr = 0.5;
  sgd.s.opt.groups[0].sgd.momentum = 0.5;
  out.push_back(sgd);
  // Two groups of different lr / betas / weight decay / momentum whose parameters straddle
  // shards and units: each shard's segments step with their own group's hyper-parameters (the
  // reference steps every parameter with its group's).
  for (int replicas : {1, 2}) {
    for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
      FsdpCase groups{absl::StrCat(replicas > 1 ? "hybrid2x2" : "rs2",
                                   kind == OptimizerKind::kSgd ? "_sgd" : "_adamw", "_two_groups"),
                      TwoGroupScenario(replicas, 2), true, 1, replicas > 1};
      groups.s.steps = 3;
      groups.s.opt.kind = kind;
      out.push_back(groups);
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, FullyShardedTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<FsdpCase>& i) { return i.param.name; });

}  // namespace
}  // namespace braid::optim::testing
