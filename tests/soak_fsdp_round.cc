// The soak's fully sharded round (tests/soak_rounds.h): the stack of
// tests/optim/fully_sharded_test.cc drawn at random. Units: 1-5, each parameter in a random one
// (every unit non-empty), a random forward order (one permutation on every rank; the backward
// runs it in reverse), prefetch 0-3 units, the live-bytes limit at its least (the largest unit),
// 2x it (the default) or unlimited, reshard_after_forward on or off, one shared pool or not;
// reduce-scatter on 1, 2 or 4 ranks or hybrid 2x2; f32 / bf16 / f16 models; the optimizer
// draws of RandomizeOptimizer (clipping, skip_nonfinite with an inf or NaN step).
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "scheduler/unit_scheduler.h"
#include "tests/multirank.h"
#include "tests/soak_rounds.h"

namespace braid::testing {
namespace {

using optim::testing::Grad;
using optim::testing::InitialValue;
using optim::testing::OptScenario;
using optim::testing::ReferenceParams;

struct FsdpScenario {
  OptScenario s;
  std::vector<int> unit_of;  // per parameter
  std::vector<int> order;    // forward order of the units
  int prefetch = 1;
  int limit = 2;  // max_live_bytes: 1 = the largest unit, 2 = 2x (the default), 0 = unlimited
  bool reshard_after_forward = true;
  bool shared_pool = false;
};

std::string Describe(const FsdpScenario& f) {
  return absl::StrCat(f.s.replicas, "x", f.s.shards, " ", DTypeName(f.s.dtype), " ",
                      f.s.opt.kind == optim::OptimizerKind::kSgd ? "sgd" : "adamw", " units ",
                      f.order.size(), " prefetch ", f.prefetch, " limit ", f.limit,
                      f.reshard_after_forward ? "" : " keep", f.shared_pool ? " shared_pool" : "",
                      f.s.opt.max_grad_norm > 0 ? " clip" : "",
                      f.s.opt.skip_nonfinite ? " skip_nonfinite" : "",
                      f.s.opt.overlap ? "" : " step()", " microbatches ", f.s.schedule.size());
}

// The harness's stack (so CheckReport reads it) with a memory count, a pool and the units.
// Members are destroyed in reverse.
struct Stack {
  sched::MemoryStats memory;
  std::shared_ptr<sched::BufferPool> pool;
  optim::testing::RankStack rs;
  std::unique_ptr<sched::UnitScheduler> units;
};

absl::StatusOr<std::unique_ptr<Stack>> Build(Group& world, const FsdpScenario& f) {
  const OptScenario& s = f.s;
  auto st = std::make_unique<Stack>();
  sched::ReducerConfig rc;
  rc.bucket_cap_bytes = s.bucket_cap_bytes;
  rc.first_bucket_cap_bytes = s.bucket_cap_bytes / 2;
  rc.timeout = absl::Seconds(60);
  rc.memory = &st->memory;
  rc.shard_gradients = true;
  if (f.shared_pool) st->pool = std::make_shared<sched::BufferPool>();
  rc.shared_pool = st->pool;
  sched::ReducerGroups groups{&world, nullptr};
  rc.mode = sched::ReduceMode::kReduceScatter;
  if (s.replicas > 1) {
    ASSIGN_OR_RETURN(st->rs.mesh, MakeMesh(world, s.replicas, s.shards));
    rc.mode = sched::ReduceMode::kHybrid;
    groups = {st->rs.mesh.shard.get(), st->rs.mesh.replica.get()};
  }
  std::vector<sched::ParamSpec> specs;
  for (size_t i = 0; i < s.counts.size(); ++i) {
    sched::ParamSpec p{static_cast<sched::ParamId>(i), s.counts[i], s.dtype, Device::Cpu(),
                       absl::StrCat("p", i)};
    p.unit = f.unit_of[i];
    specs.push_back(p);
  }
  ASSIGN_OR_RETURN(st->rs.reducer, sched::GradientReducer::Create(specs, groups, rc));
  ASSIGN_OR_RETURN(st->rs.gather_group, groups.shard->Split(0, groups.shard->rank(), "gather"));
  sched::GathererConfig gc;
  gc.timeout = absl::Seconds(60);
  gc.fully_sharded = true;
  gc.memory = &st->memory;
  gc.shared_pool = st->pool;
  ASSIGN_OR_RETURN(st->rs.gatherer, sched::ParamGatherer::Create(st->rs.reducer->plan(),
                                                                 st->rs.gather_group.get(), gc));
  optim::OptimizerConfig oc = s.opt;
  oc.timeout = absl::Seconds(60);
  oc.memory = &st->memory;
  oc.fully_sharded = true;
  ASSIGN_OR_RETURN(
      st->rs.opt, optim::ShardedOptimizer::Create(st->rs.reducer.get(), st->rs.gatherer.get(), oc));
  for (size_t i = 0; i < s.counts.size(); ++i) {
    std::vector<uint8_t> init(s.counts[i] * DTypeSize(s.dtype));
    for (size_t j = 0; j < s.counts[i]; ++j)
      StoreElement(init.data(), s.dtype, j, InitialValue(static_cast<int>(i), j));
    RETURN_IF_ERROR(st->rs.opt->SetParam(static_cast<sched::ParamId>(i), init.data()));
  }
  const sched::BucketPlan& plan = st->rs.reducer->plan();
  int64_t largest = 0;
  for (int u = 0; u < plan.num_units(); ++u) {
    int64_t bytes = 0;
    for (int b : plan.UnitBuckets(u)) bytes += static_cast<int64_t>(plan.buckets()[b].bytes());
    largest = std::max(largest, bytes);
  }
  sched::UnitConfig uc;
  uc.timeout = absl::Seconds(60);
  uc.prefetch = f.prefetch;
  uc.reshard_after_forward = f.reshard_after_forward;
  uc.max_live_bytes = f.limit == 0 ? (size_t{1} << 40) : static_cast<size_t>(f.limit * largest);
  uc.memory = &st->memory;
  optim::ShardedOptimizer* opt = st->rs.opt.get();
  uc.before_gather = [opt](int b, DeviceEvent* ready) { return opt->WaitShard(b, ready); };
  ASSIGN_OR_RETURN(st->units, sched::UnitScheduler::Create(st->rs.gatherer.get(), uc));
  return st;
}

// Forward through the units in f.order: every parameter equals the reference after t steps.
absl::Status Forward(Stack& st, const FsdpScenario& f, int t, int rank) {
  const std::vector<std::vector<uint8_t>> want = ReferenceParams(f.s, t);
  for (int u : f.order) {
    RETURN_IF_ERROR(st.units->BeginForward(u));
    for (size_t i = 0; i < f.s.counts.size(); ++i) {
      if (f.unit_of[i] != u) continue;
      ASSIGN_OR_RETURN(TensorView v, st.rs.gatherer->ParamView(static_cast<sched::ParamId>(i)));
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

// Microbatch mb's backward: units in reverse forward order, each unit's gradients copied in
// (MarkReady with the values) in a random order; the last rank's bad value at s.inf_step as in
// the harness's RunSteps.
absl::Status Backward(Stack& st, const FsdpScenario& f, int t, int mb, int rank, int world) {
  const OptScenario& s = f.s;
  RETURN_IF_ERROR(st.rs.opt->BeginBackward(s.schedule[mb]));
  std::mt19937 rng(static_cast<uint32_t>(1000 * rank + 10 * t + mb));
  const bool last_mb = mb + 1 == static_cast<int>(s.schedule.size());
  std::vector<uint8_t> grad;
  for (auto u = f.order.rbegin(); u != f.order.rend(); ++u) {
    RETURN_IF_ERROR(st.units->BeginBackward(*u));
    std::vector<int> ids;
    for (size_t i = 0; i < s.counts.size(); ++i) {
      if (f.unit_of[i] == *u) ids.push_back(static_cast<int>(i));
    }
    std::shuffle(ids.begin(), ids.end(), rng);
    for (int i : ids) {
      grad.assign(s.counts[i] * DTypeSize(s.dtype), 0);
      for (size_t j = 0; j < s.counts[i]; ++j)
        StoreElement(grad.data(), s.dtype, j, Grad(rank, t, mb, i, j, s));
      if (t == s.inf_step && rank == world - 1 && last_mb && i == 0)
        StoreElement(grad.data(), s.dtype, 0, s.bad_value);
      RETURN_IF_ERROR(st.rs.reducer->MarkReady(i, DeviceEvent{}, grad.data()));
    }
    RETURN_IF_ERROR(st.units->EndBackward(*u));
  }
  return st.rs.opt->FinishBackward();
}

absl::Status RunFsdp(Group& world, const FsdpScenario& f) {
  ASSIGN_OR_RETURN(auto st, Build(world, f));
  const int n = world.size();
  for (int t = 0; t < f.s.steps; ++t) {
    for (int mb = 0; mb < static_cast<int>(f.s.schedule.size()); ++mb) {
      RETURN_IF_ERROR(Forward(*st, f, t, world.rank()));
      RETURN_IF_ERROR(Backward(*st, f, t, mb, world.rank(), n));
      RETURN_IF_ERROR(st->units->EndStep());
    }
    if (!f.s.opt.overlap) RETURN_IF_ERROR(st->rs.opt->Step());
    RETURN_IF_ERROR(st->rs.opt->WaitAllParams());
    if (st->units->live_bytes() != 0 || st->rs.gatherer->held_bytes() != 0) {
      return absl::InternalError(absl::StrCat("rank ", world.rank(), " step ", t, ": ",
                                              st->units->live_bytes(),
                                              " gathered bytes not released"));
    }
  }
  RETURN_IF_ERROR(Forward(*st, f, f.s.steps, world.rank()));
  return optim::testing::CheckReport(st->rs, f.s);
}

}  // namespace

int FsdpRound(uint64_t seed) {
  std::mt19937_64 rng(seed);
  FsdpScenario f;
  static const int kMeshes[][2] = {{1, 1}, {1, 2}, {1, 4}, {2, 2}};
  const auto& mesh = kMeshes[rng() % 4];
  f.s = optim::testing::TwoGroupScenario(mesh[0], mesh[1]);
  static const DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  f.s.dtype = kDtypes[rng() % 3];
  RandomizeOptimizer(rng, 2 + static_cast<int>(rng() % 2), &f.s);
  f.s.bucket_cap_bytes = size_t{256} << (rng() % 4);
  f.s.schedule = RandomSchedule(rng, f.s.replicas > 1);
  const int P = static_cast<int>(f.s.counts.size());
  const int units = 1 + static_cast<int>(rng() % 5);
  f.unit_of.resize(P);
  for (int i = 0; i < P; ++i) f.unit_of[i] = i < units ? i : static_cast<int>(rng() % units);
  std::shuffle(f.unit_of.begin(), f.unit_of.end(), rng);
  f.order.resize(units);
  std::iota(f.order.begin(), f.order.end(), 0);
  std::shuffle(f.order.begin(), f.order.end(), rng);
  f.prefetch = static_cast<int>(rng() % 4);
  f.limit = static_cast<int>(rng() % 3);
  f.reshard_after_forward = rng() % 4 != 0;
  f.shared_pool = rng() % 2 == 0;
  const std::string what = absl::StrCat("fsdp round seed ", seed, ": ", Describe(f));
  RunRanks(f.s.replicas * f.s.shards, [&](Group& world) {
    const absl::Status st = RunFsdp(world, f);
    EXPECT_TRUE(st.ok()) << what << ": " << st;
  });
  return f.s.steps;
}

}  // namespace braid::testing
