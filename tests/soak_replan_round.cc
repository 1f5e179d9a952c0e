// The soak's re-plan round (tests/soak_rounds.h): a TrainingStack with its optimizer
// (reduce-scatter on 1, 2 or 4 ranks or hybrid 2x2, f32 / bf16 / f16, the optimizer draws of
// RandomizeOptimizer) re-plans at random step boundaries, carrying the optimizer's state over:
// DDP's rebuild from the first synced backward's readiness order (when rebuild_bucket_order is
// drawn) and Replan to random bucket caps. Every step's parameters match the serial reference
// bit for bit, whatever the plan they were stepped under.
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "optim/training_stack.h"
#include "tests/multirank.h"
#include "tests/soak_rounds.h"

namespace braid::testing {
namespace {

using optim::testing::Grad;
using optim::testing::InitialValue;
using optim::testing::OptScenario;

struct ReplanScenario {
  OptScenario s;
  bool rebuild_order = false;  // rebuild once, at step 1 (after the first synced backward)
  // Before step t (t >= 1), when caps[t] is not 0: Replan(caps[t], caps[t] / 2).
  std::vector<size_t> caps;
};

struct Built {
  Mesh mesh;
  std::unique_ptr<optim::TrainingStack> stack;
};

absl::StatusOr<Built> Build(Group& world, const ReplanScenario& r) {
  const OptScenario& s = r.s;
  Built b;
  optim::StackOptions so;
  so.reducer.bucket_cap_bytes = s.bucket_cap_bytes;
  so.reducer.first_bucket_cap_bytes = s.bucket_cap_bytes / 2;
  so.reducer.timeout = absl::Seconds(60);
  so.reducer.rebuild_bucket_order = r.rebuild_order;
  so.reducer.mode = sched::ReduceMode::kReduceScatter;
  sched::ReducerGroups groups{&world, nullptr};
  if (s.replicas > 1) {
    ASSIGN_OR_RETURN(b.mesh, MakeMesh(world, s.replicas, s.shards));
    so.reducer.mode = sched::ReduceMode::kHybrid;
    groups = {b.mesh.shard.get(), b.mesh.replica.get()};
  }
  std::vector<sched::ParamSpec> specs;
  for (size_t i = 0; i < s.counts.size(); ++i) {
    specs.push_back(sched::ParamSpec{static_cast<sched::ParamId>(i), s.counts[i], s.dtype,
                                     Device::Cpu(), absl::StrCat("p", i)});
  }
  ASSIGN_OR_RETURN(b.stack, optim::TrainingStack::Create(specs, groups, so));
  optim::ParamOptions po;
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

// Step t through the stack: the harness's gradients accumulated into the gradient views in a
// random order per rank, step and microbatch, the last rank's bad value at s.inf_step.
absl::Status Step(optim::TrainingStack& st, const OptScenario& s, int t, int rank, int world) {
  const int P = static_cast<int>(s.counts.size());
  const int U = static_cast<int>(s.schedule.size());
  for (int u = 0; u < U; ++u) {
    RETURN_IF_ERROR(st.BeginBackward(s.schedule[u]));
    std::vector<int> order(P);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(rank * 1000 + t * 10 + u));
    for (int i : order) {
      ASSIGN_OR_RETURN(TensorView g, st.reducer().GradView(i));
      for (size_t j = 0; j < g.count; ++j) {
        StoreElement(
            g.data, s.dtype, j,
            static_cast<float>(LoadElement(g.data, s.dtype, j)) + Grad(rank, t, u, i, j, s));
      }
      if (t == s.inf_step && rank == world - 1 && u + 1 == U && i == 0)
        StoreElement(g.data, s.dtype, 0, s.bad_value);
      RETURN_IF_ERROR(st.reducer().MarkReady(i));
    }
    RETURN_IF_ERROR(st.FinishBackward());
  }
  ASSIGN_OR_RETURN(optim::ShardedOptimizer * opt, st.LiveOptimizer());
  if (!s.opt.overlap) RETURN_IF_ERROR(opt->Step());
  return opt->WaitAllParams();
}

absl::Status RunReplan(Group& world, const ReplanScenario& r) {
  const OptScenario& s = r.s;
  ASSIGN_OR_RETURN(Built b, Build(world, r));
  optim::TrainingStack& st = *b.stack;
  const std::string at = absl::StrCat("rank ", world.rank(), ": ");
  for (int t = 0; t < s.steps; ++t) {
    if (t == 1 && r.rebuild_order) {
      ASSIGN_OR_RETURN(const bool rebuilt, st.RebuildBuckets());
      if (!rebuilt) return absl::InternalError(at + "RebuildBuckets had nothing to rebuild");
    }
    if (t >= 1 && r.caps[t] != 0) {
      // Caps that give the buckets the plan has leave it (and its options) as it was and
      // rebuild nothing (false); new buckets carry the optimizer over (true).
      const uint64_t before = st.reducer().plan().Fingerprint();
      ASSIGN_OR_RETURN(const bool moved, st.Replan(r.caps[t], r.caps[t] / 2));
      const bool changed = st.reducer().plan().Fingerprint() != before;
      if (moved != changed) {
        return absl::InternalError(absl::StrCat(at, "Replan(", r.caps[t], ") returned ", moved,
                                                " but the buckets changed: ", changed));
      }
      if (changed && st.reducer().plan().options().bucket_cap_bytes != r.caps[t])
        return absl::InternalError(absl::StrCat(at, "Replan(", r.caps[t], ") did not adopt it"));
    }
    RETURN_IF_ERROR(Step(st, s, t, world.rank(), world.size()));
    const std::vector<std::vector<uint8_t>> want = optim::testing::ReferenceParams(s, t + 1);
    for (size_t i = 0; i < s.counts.size(); ++i) {
      ASSIGN_OR_RETURN(TensorView v, st.gatherer()->ParamView(static_cast<sched::ParamId>(i)));
      if (std::memcmp(v.data, want[i].data(), want[i].size()) != 0) {
        return absl::InternalError(absl::StrCat(at, "parameter ", i, " (plan generation ",
                                                st.reducer().plan_generation(),
                                                ") differs from the reference after step ", t));
      }
    }
  }
  ASSIGN_OR_RETURN(optim::ShardedOptimizer * opt, st.LiveOptimizer());
  const optim::StepReport report = opt->last_step();
  const bool skipped = s.opt.skip_nonfinite && s.inf_step == s.steps - 1;
  if (report.rounds < 1 || report.skipped != skipped || !report.error.ok()) {
    return absl::InternalError(absl::StrCat(at, "last step: rounds ", report.rounds, ", skipped ",
                                            report.skipped, ", error ", report.error.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

int ReplanRound(uint64_t seed) {
  std::mt19937_64 rng(seed);
  ReplanScenario r;
  static const int kMeshes[][2] = {{1, 1}, {1, 2}, {1, 4}, {2, 2}};
  const auto& mesh = kMeshes[rng() % 4];
  r.s = optim::testing::TwoGroupScenario(mesh[0], mesh[1]);
  static const DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  r.s.dtype = kDtypes[rng() % 3];
  RandomizeOptimizer(rng, 3 + static_cast<int>(rng() % 2), &r.s);
  r.s.bucket_cap_bytes = size_t{256} << (rng() % 5);
  r.s.schedule = RandomSchedule(rng, r.s.replicas > 1);
  r.rebuild_order = rng() % 2 == 0;
  r.caps.assign(r.s.steps, 0);
  for (int t = 1; t < r.s.steps; ++t) {
    if (rng() % 2 == 0) r.caps[t] = size_t{128} << (rng() % 6);
  }
  std::string caps;
  for (size_t c : r.caps) absl::StrAppend(&caps, caps.empty() ? "" : ",", c);
  const std::string what = absl::StrCat("replan round seed ", seed, ": ", DescribeOptimizer(r.s),
                                        r.rebuild_order ? " rebuild" : "", " caps by step ", caps);
  RunRanks(r.s.replicas * r.s.shards, [&](Group& world) {
    const absl::Status st = RunReplan(world, r);
    EXPECT_TRUE(st.ok()) << what << ": " << st;
  });
  return r.s.steps;
}

}  // namespace braid::testing
