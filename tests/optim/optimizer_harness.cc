#include "tests/optim/optimizer_harness.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "comm/element.h"
#include "comm/reduce_kernels.h"
#include "comm/status_macros.h"

namespace braid::optim::testing {
namespace {

float Widen(DType t, const void* p, size_t j) { return static_cast<float>(LoadElement(p, t, j)); }

int GroupOf(const OptScenario& s, int i) {
  auto it = s.opt.group_of.find(i);
  return it == s.opt.group_of.end() ? 0 : it->second;
}

std::vector<GroupHyper> HyperAt(const OptScenario& s, int t) {
  std::vector<GroupHyper> h = s.opt.groups;
  if (s.lr_change_step >= 0 && t >= s.lr_change_step) {
    h[0].adamw.lr *= 0.5;
    h[0].sgd.lr *= 0.5;
  }
  return h;
}

}  // namespace

void PrintTo(const NamedScenario& c, std::ostream* os) { *os << c.name; }

OptScenario TwoGroupScenario(int replicas, int shards) {
  OptScenario s;
  s.replicas = replicas;
  s.shards = shards;
  s.opt.groups = {GroupHyper{}, GroupHyper{}};
  s.opt.groups[0].adamw = AdamWHyper{1e-2, 0.9, 0.999, 1e-8, 0.1};
  s.opt.groups[1].adamw = AdamWHyper{3e-3, 0.8, 0.99, 1e-6, 0.0};  // biases: no decay
  s.opt.groups[0].sgd = SgdHyper{0.05, 0.9, 0.01, false};
  s.opt.groups[1].sgd = SgdHyper{0.02, 0.5, 0.0, true};
  s.opt.group_of = {{2, 1}, {6, 1}, {8, 1}};
  return s;
}

float Grad(int rank, int t, int u, int i, size_t j, const OptScenario& s) {
  (void)s;
  const int k =
      static_cast<int>((rank * 7 + t * 3 + u * 5 + i * 11 + static_cast<int>(j % 1000) * 13) % 17) -
      8;
  return static_cast<float>(k) / 8.0f;
}

bool UsedIn(int rank, int t, int u, int i, const OptScenario& s) {
  if (s.agree == sched::UnusedAgreement::kNone) return true;
  if (i == 3 && t % 2 == 1) return false;
  if (i == 4 && t == 2) return rank == 0;
  return (rank * 5 + t * 3 + u * 7 + i * 13) % 4 != 0;
}

float InitialValue(int i, size_t j) {
  return static_cast<float>(static_cast<int>((i * 31 + static_cast<int>(j % 1000) * 7) % 23) - 11) /
         16.0f;
}

absl::StatusOr<std::unique_ptr<RankStack>> BuildStack(Group& world, const OptScenario& s,
                                                      const StackPlacement& where) {
  auto st = std::make_unique<RankStack>();
  st->world_rank = world.rank();
  st->world_size = world.size();
  sched::ReducerConfig rc;
  rc.bucket_cap_bytes = s.bucket_cap_bytes;
  rc.first_bucket_cap_bytes = s.bucket_cap_bytes / 2;
  rc.timeout = where.timeout;
  rc.agree_unused = s.agree;
  sched::ReducerGroups groups;
  if (s.replicas > 1) {
    ASSIGN_OR_RETURN(st->mesh, MakeMesh(world, s.replicas, s.shards));
    rc.mode = sched::ReduceMode::kHybrid;
    groups = {st->mesh.shard.get(), st->mesh.replica.get()};
  } else {
    rc.mode = sched::ReduceMode::kReduceScatter;
    groups = {&world, nullptr};
  }
  std::vector<sched::ParamSpec> specs;
  for (size_t i = 0; i < s.counts.size(); ++i) {
    specs.push_back(sched::ParamSpec{static_cast<sched::ParamId>(i), s.counts[i], s.dtype,
                                     where.device, absl::StrCat("p", i)});
  }
  ASSIGN_OR_RETURN(st->reducer, sched::GradientReducer::Create(specs, groups, rc));
  ASSIGN_OR_RETURN(st->gather_group, groups.shard->Split(0, groups.shard->rank(), "gather"));
  sched::GathererConfig gc;
  gc.timeout = where.timeout;
  ASSIGN_OR_RETURN(st->gatherer,
                   sched::ParamGatherer::Create(st->reducer->plan(), st->gather_group.get(), gc));
  OptimizerConfig oc = s.opt;
  oc.timeout = where.timeout;
  oc.device_kernels = where.kernels;
  ASSIGN_OR_RETURN(st->opt, ShardedOptimizer::Create(st->reducer.get(), st->gatherer.get(), oc));
  for (size_t i = 0; i < s.counts.size(); ++i) {
    std::vector<uint8_t> init(s.counts[i] * DTypeSize(s.dtype));
    for (size_t j = 0; j < s.counts[i]; ++j)
      StoreElement(init.data(), s.dtype, j, InitialValue(static_cast<int>(i), j));
    RETURN_IF_ERROR(st->opt->SetParam(static_cast<sched::ParamId>(i), init.data()));
  }
  RETURN_IF_ERROR(st->opt->WaitAllParams());
  return st;
}

absl::Status RunSteps(RankStack& st, const OptScenario& s, int first, int last) {
  const int P = static_cast<int>(s.counts.size());
  for (int t = first; t < last; ++t) {
    if (t == s.lr_change_step) RETURN_IF_ERROR(st.opt->SetHyper(0, HyperAt(s, t)[0]));
    for (int u = 0; u < static_cast<int>(s.schedule.size()); ++u) {
      RETURN_IF_ERROR(st.opt->BeginBackward(s.schedule[u]));
      std::vector<int> order(P);
      std::iota(order.begin(), order.end(), 0);
      std::mt19937 rng(static_cast<uint32_t>(st.world_rank * 1000 + t * 10 + u));
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<sched::ParamId> unused;
      for (int i = 0; i < P; ++i) {
        if (!UsedIn(st.world_rank, t, u, i, s)) unused.push_back(i);
      }
      if (s.agree == sched::UnusedAgreement::kDeclared) {
        RETURN_IF_ERROR(st.reducer->DeclareUnused(unused));
      }
      for (int i : order) {
        if (!UsedIn(st.world_rank, t, u, i, s)) continue;
        ASSIGN_OR_RETURN(TensorView g, st.reducer->GradView(i));
        for (size_t j = 0; j < g.count; ++j) {
          StoreElement(g.data, s.dtype, j,
                       Widen(s.dtype, g.data, j) + Grad(st.world_rank, t, u, i, j, s));
        }
        if (t == s.inf_step && st.world_rank == st.world_size - 1 &&
            u + 1 == static_cast<int>(s.schedule.size()) && i == 0) {
          StoreElement(g.data, s.dtype, 0, s.bad_value);
        }
        RETURN_IF_ERROR(st.reducer->MarkReady(i));
      }
      RETURN_IF_ERROR(st.opt->FinishBackward());
    }
    if (!s.opt.overlap) RETURN_IF_ERROR(st.opt->Step());
    RETURN_IF_ERROR(st.opt->WaitAllParams());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<uint8_t>>> Params(RankStack& st, const OptScenario& s) {
  std::vector<std::vector<uint8_t>> out;
  for (size_t i = 0; i < s.counts.size(); ++i) {
    ASSIGN_OR_RETURN(TensorView v, st.gatherer->ParamView(static_cast<sched::ParamId>(i)));
    const auto* p = static_cast<const uint8_t*>(v.data);
    out.emplace_back(p, p + v.count * DTypeSize(v.dtype));
  }
  return out;
}

absl::Status CheckAgainstReference(Group& world, const OptScenario& s) {
  ASSIGN_OR_RETURN(std::unique_ptr<RankStack> st, BuildStack(world, s));
  for (int t = 0; t <= s.steps; ++t) {
    if (t > 0) RETURN_IF_ERROR(RunSteps(*st, s, t - 1, t));
    ASSIGN_OR_RETURN(auto got, Params(*st, s));
    const auto want = ReferenceParams(s, t);
    for (size_t i = 0; i < s.counts.size(); ++i) {
      if (got[i] != want[i]) {
        size_t j = 0;
        const size_t es = DTypeSize(s.dtype);
        while (j + 1 < s.counts[i] && std::memcmp(&got[i][j * es], &want[i][j * es], es) == 0) ++j;
        return absl::InternalError(absl::StrCat(
            "rank ", world.rank(), ": parameter ", i, " differs from the reference after ", t,
            " steps, first at element ", j, ": got ", Widen(s.dtype, got[i].data(), j), ", want ",
            Widen(s.dtype, want[i].data(), j)));
      }
    }
  }
  return CheckReport(*st, s);
}

absl::Status CheckReport(RankStack& st, const OptScenario& s) {
  const StepReport r = st.opt->last_step();
  const bool skipped_one = s.inf_step >= 0 && s.opt.skip_nonfinite;
  if (r.rounds != s.steps)
    return absl::InternalError(absl::StrCat("rounds ", r.rounds, ", want ", s.steps));
  RETURN_IF_ERROR(r.error);
  if (r.skipped != (skipped_one && s.inf_step == s.steps - 1))
    return absl::InternalError("wrong skipped flag");
  if (s.opt.max_grad_norm > 0 || s.opt.skip_nonfinite || s.opt.track_grad_norm) {
    const double want = ReferenceNorm(s, s.steps - 1);
    const bool same = std::isnan(want) ? std::isnan(r.grad_norm) : r.grad_norm == want;
    if (!same)
      return absl::InternalError(absl::StrCat("gradient norm ", r.grad_norm, ", reference ", want));
  }
  if (s.opt.max_grad_norm > 0 && !r.skipped && std::isfinite(r.grad_norm)) {
    const double want = std::min(1.0, s.opt.max_grad_norm / (r.grad_norm + 1e-6));
    if (r.clip_scale != want) {
      return absl::InternalError(
          absl::StrCat("clip factor ", r.clip_scale, " for norm ", r.grad_norm, ", want ", want));
    }
  }
  for (int b = 0; b < static_cast<int>(st.reducer->plan().buckets().size()); ++b) {
    if (st.opt->bucket_steps(b) != s.steps - (skipped_one ? 1 : 0)) {
      return absl::InternalError(
          absl::StrCat("bucket ", b, " took ", st.opt->bucket_steps(b), " steps"));
    }
  }
  return absl::OkStatus();
}

namespace {

// The averaged gradient of step t's window (exact: see the header) into g; returns its sum of
// squares.
double AveragedGrad(const OptScenario& s, int t, std::vector<std::vector<float>>* g) {
  const int P = static_cast<int>(s.counts.size());
  const int n = s.replicas * s.shards;
  const int U = static_cast<int>(s.schedule.size());
  double sumsq = 0;
  g->assign(P, {});
  for (int i = 0; i < P; ++i) {
    (*g)[i].resize(s.counts[i]);
    for (size_t j = 0; j < s.counts[i]; ++j) {
      double sum = 0;
      for (int r = 0; r < n; ++r) {
        for (int u = 0; u < U; ++u) {
          if (UsedIn(r, t, u, i, s)) sum += Grad(r, t, u, i, j, s);
        }
      }
      if (t == s.inf_step && i == 0 && j == 0) sum = s.bad_value;
      (*g)[i][j] = static_cast<float>(sum / n);
      sumsq += static_cast<double>((*g)[i][j]) * (*g)[i][j];
    }
  }
  return sumsq;
}

}  // namespace

double ReferenceNorm(const OptScenario& s, int t) {
  std::vector<std::vector<float>> g;
  return std::sqrt(AveragedGrad(s, t, &g));
}

std::vector<std::vector<uint8_t>> ReferenceParams(const OptScenario& s, int last) {
  const int P = static_cast<int>(s.counts.size());
  std::vector<std::vector<float>> master(P), m(P), v(P);
  for (int i = 0; i < P; ++i) {
    master[i].resize(s.counts[i]);
    m[i].assign(s.counts[i], 0.0f);
    v[i].assign(s.counts[i], 0.0f);
    for (size_t j = 0; j < s.counts[i]; ++j) {
      std::vector<uint8_t> tmp(DTypeSize(s.dtype));
      StoreElement(tmp.data(), s.dtype, 0, InitialValue(i, j));
      master[i][j] = Widen(s.dtype, tmp.data(), 0);
    }
  }
  std::vector<int64_t> steps(P, 0);  // per parameter, as torch's optimizer state['step']
  for (int t = 0; t < last; ++t) {
    std::vector<std::vector<float>> g;
    const double norm = std::sqrt(AveragedGrad(s, t, &g));
    if (s.opt.skip_nonfinite && !std::isfinite(norm)) continue;  // dropped on every rank
    double scale = 1.0;
    if (s.opt.max_grad_norm > 0 && std::isfinite(norm))
      scale = std::min(1.0, s.opt.max_grad_norm / (norm + 1e-6));
    const std::vector<GroupHyper> hyper = HyperAt(s, t);
    for (int i = 0; i < P; ++i) {
      bool used = false;  // by some rank in some microbatch: else skipped (torch: grad None)
      for (int r = 0; r < s.replicas * s.shards; ++r) {
        for (int u = 0; u < static_cast<int>(s.schedule.size()); ++u) used |= UsedIn(r, t, u, i, s);
      }
      if (!used) continue;
      ++steps[i];
      const GroupHyper& h = hyper[GroupOf(s, i)];
      for (size_t j = 0; j < s.counts[i]; ++j) {
        if (s.opt.kind == OptimizerKind::kAdamW) {
          AdamWElement(StepScalars(h.adamw, steps[i], scale), g[i][j], &master[i][j], &m[i][j],
                       &v[i][j]);
        } else {
          SgdElement(SgdStepScalars(h.sgd, steps[i], scale), g[i][j], &master[i][j], &m[i][j]);
        }
      }
    }
  }
  std::vector<std::vector<uint8_t>> out(P);
  for (int i = 0; i < P; ++i) {
    out[i].resize(s.counts[i] * DTypeSize(s.dtype));
    for (size_t j = 0; j < s.counts[i]; ++j) StoreElement(out[i].data(), s.dtype, j, master[i][j]);
  }
  return out;
}

}  // namespace braid::optim::testing
