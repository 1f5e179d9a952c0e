// One optimizer over several reducers (optim/linked_optimizers.h) on the `local` backend, 4
// ranks, groups built from the world's Splits as a MoE + tensor-parallel model lays them out:
//   dense      reduce-scattered over the 4 ranks (or hybrid: 2 replicas x 2 shards)
//   experts    expert-parallel rank e = rank % 2 holds expert e, reduced over the ranks of e
//   tp shards  tensor-parallel rank k = rank % 2 holds shard k, reduced over the ranks of k
//              (never across the tensor-parallel pair {2i, 2i+1})
//   layer norm identical on both tensor-parallel ranks, reduced over the ranks of k
//              (tp_replicated: its norm counts once)
// against a serial reference: each member's gradients averaged over its reducing ranks, one
// global norm over everything (every expert, every tensor-parallel shard, the layer norm
// once), one clip, AdamW. Gradients are k/8 and averages over 2 or 4 ranks, so every sum and
// squared norm is exact and the comparison is bit for bit. Built twice: on `local` threads
// (with a fault-injection case) and, with BRAID_LINKED_MPI, under mpirun -np 4. The stress
// cases run many steps with random sleeps between the marks, so each member's stepper reaches
// the global norm first or last in turn, and check every step; one gives each member its own
// optimizer and norm (the unlinked path) for comparison.
#include "optim/linked_optimizers.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/local/local_backend.h"
#include "comm/mesh.h"
#include "comm/status_macros.h"
#include "gtest/gtest.h"
#include "optim/adamw_math.h"
#include "tests/multirank.h"
#if defined(BRAID_LINKED_MPI)
#include "tests/mpi_world.h"
#endif

namespace braid::optim {
namespace {

using braid::testing::ExpectError;
using braid::testing::RunRanks;

enum Member { kDense = 0, kExpert = 1, kTp = 2, kNorm = 3, kMembers = 4 };
const std::vector<std::vector<size_t>> kCounts = {{37, 128, 5, 300}, {64, 17, 90}, {33, 250}, {48}};
constexpr int kWorld = 4;
constexpr int kSteps = 3;

struct Case {
  std::string name;
  bool dense_hybrid = false;
  double max_grad_norm = 0.5;  // the norms are ~5-10: clipping is active
  bool skip_nonfinite = false;
  int inf_step = -1;   // at this step rank 3 puts inf into expert 1's first gradient
  bool track = false;  // track_grad_norm
  bool linked = true;  // false: each member its own optimizer, clipped by its own norm
  int steps = kSteps;
  bool jitter = false;  // random sleeps between the marks (seeded by rank and step)
};

// Which copy of a member's parameters `rank` holds (its expert / tensor-parallel shard).
int Owner(int m, int rank) { return m == kExpert || m == kTp ? rank % 2 : 0; }
// Whose contribution a rank's gradient is: the layer norm's is the same on both
// tensor-parallel ranks (its forward saw the same activations).
int Source(int m, int rank) { return m == kNorm ? rank / 2 : rank; }
// The ranks a member's gradients are averaged over, for the copy `rank` holds.
std::vector<int> Reducing(int m, int rank) {
  std::vector<int> out;
  for (int r = 0; r < kWorld; ++r) {
    if (m == kDense || r % 2 == rank % 2) out.push_back(r);
  }
  return out;
}

float Grad(int m, int source, int t, int i, size_t j) {
  const uint32_t h = static_cast<uint32_t>(m * 7919 + source * 104729 + t * 31 + i * 613) +
                     static_cast<uint32_t>(j) * 2654435761u;
  return static_cast<float>(static_cast<int>((h >> 7) % 17) - 8) / 8.0f;
}
float Initial(int m, int owner, int i, size_t j) {
  return static_cast<float>(static_cast<int>((m * 5 + owner * 3 + i + j) % 33) - 16) / 16.0f;
}

// Reduced (averaged) gradient of member m, copy held by `rank`, param i, element j.
float Averaged(const Case& c, int m, int rank, int t, int i, size_t j) {
  const std::vector<int> ranks = Reducing(m, rank);
  double sum = 0;
  for (int r : ranks) sum += Grad(m, Source(m, r), t, i, j);
  if (t == c.inf_step && m == kExpert && Owner(m, rank) == 1 && i == 0 && j == 0) return INFINITY;
  return static_cast<float>(sum / ranks.size());
}

// The serial reference: parameters of copy `rank` of every member after `steps` steps, and the
// last step's norm.
struct Reference {
  std::vector<std::vector<std::vector<float>>> params;  // [member][param][element]
  double norm = -1;
  std::vector<double> member_norm;  // unlinked: each member's own, for the copy `rank` holds
};
Reference Serial(const Case& c, int rank, const AdamWHyper& h, int steps) {
  // Every copy of every member (rank 0 and 1 cover both experts and both TP shards).
  std::vector<std::vector<std::vector<std::vector<float>>>> p(2), mo(2), v(2);  // [copy][m][i]
  for (int copy = 0; copy < 2; ++copy) {
    for (int m = 0; m < kMembers; ++m) {
      p[copy].emplace_back();
      for (size_t i = 0; i < kCounts[m].size(); ++i) {
        std::vector<float> x(kCounts[m][i]);
        for (size_t j = 0; j < x.size(); ++j) x[j] = Initial(m, Owner(m, copy), i, j);
        p[copy][m].push_back(x);
      }
      mo[copy].push_back(std::vector<std::vector<float>>(p[copy][m].size()));
      v[copy].push_back(std::vector<std::vector<float>>(p[copy][m].size()));
      for (size_t i = 0; i < kCounts[m].size(); ++i) {
        mo[copy][m][i].assign(kCounts[m][i], 0.0f);
        v[copy][m][i].assign(kCounts[m][i], 0.0f);
      }
    }
  }
  Reference ref;
  int64_t taken = 0;
  for (int t = 0; t < steps; ++t) {
    double sumsq = 0;              // dense and layer norm once; each expert and TP shard once
    double own[2][kMembers] = {};  // [copy][m]: each member's own norm (unlinked)
    for (int m = 0; m < kMembers; ++m) {
      const int copies = m == kExpert || m == kTp ? 2 : 1;
      for (int copy = 0; copy < 2; ++copy) {
        for (size_t i = 0; i < kCounts[m].size(); ++i) {
          for (size_t j = 0; j < kCounts[m][i]; ++j) {
            const double g = Averaged(c, m, copy, t, i, j);
            if (copy < copies) sumsq += g * g;
            own[copy][m] += g * g;
          }
        }
      }
    }
    ref.norm = std::sqrt(sumsq);
    ref.member_norm.assign(kMembers, 0.0);
    for (int m = 0; m < kMembers; ++m) ref.member_norm[m] = std::sqrt(own[rank % 2][m]);
    if (!c.linked) {  // the case has no inf: every member steps, each clipped by its own norm
      for (int copy = 0; copy < 2; ++copy) {
        for (int m = 0; m < kMembers; ++m) {
          const double n = std::sqrt(own[copy][m]);
          const AdamWScalars k = StepScalars(h, t + 1, std::min(1.0, c.max_grad_norm / (n + 1e-6)));
          for (size_t i = 0; i < kCounts[m].size(); ++i) {
            for (size_t j = 0; j < kCounts[m][i]; ++j) {
              AdamWElement(k, Averaged(c, m, copy, t, i, j), &p[copy][m][i][j], &mo[copy][m][i][j],
                           &v[copy][m][i][j]);
            }
          }
        }
      }
      continue;
    }
    if (c.skip_nonfinite && !std::isfinite(ref.norm)) continue;
    const double scale = c.max_grad_norm > 0 && std::isfinite(ref.norm)
                             ? std::min(1.0, c.max_grad_norm / (ref.norm + 1e-6))
                             : 1.0;
    const AdamWScalars k = StepScalars(h, ++taken, scale);
    for (int copy = 0; copy < 2; ++copy) {
      for (int m = 0; m < kMembers; ++m) {
        for (size_t i = 0; i < kCounts[m].size(); ++i) {
          for (size_t j = 0; j < kCounts[m][i]; ++j) {
            AdamWElement(k, Averaged(c, m, copy, t, i, j), &p[copy][m][i][j], &mo[copy][m][i][j],
                         &v[copy][m][i][j]);
          }
        }
      }
    }
  }
  ref.params = p[rank % 2];
  return ref;
}

// One rank's groups and stacks, destroyed in reverse.
struct Rank {
  Mesh dense_mesh;                   // hybrid dense only
  std::unique_ptr<Group> expert_dp;  // ranks holding the same expert
  std::unique_ptr<Group> tp;         // the tensor-parallel pair
  std::unique_ptr<Group> tp_dp;      // ranks holding the same TP shard
  std::unique_ptr<Group> norm_dp;    // the same ranks, for the layer norm's reducer
  std::vector<std::unique_ptr<TrainingStack>> stacks;
};

absl::StatusOr<std::unique_ptr<Rank>> Build(Group& world, const Case& c, OptimizerConfig oc) {
  auto r = std::make_unique<Rank>();
  const int me = world.rank();
  ASSIGN_OR_RETURN(r->expert_dp, world.Split(me % 2, me, "expert_dp"));
  ASSIGN_OR_RETURN(r->tp, world.Split(me / 2, me % 2, "tp"));
  ASSIGN_OR_RETURN(r->tp_dp, world.Split(me % 2, me, "tp_dp"));
  ASSIGN_OR_RETURN(r->norm_dp, world.Split(me % 2, me, "norm_dp"));
  if (c.dense_hybrid) {
    ASSIGN_OR_RETURN(r->dense_mesh, MakeMesh(world, 2, 2));
  }
  for (int m = 0; m < kMembers; ++m) {
    StackOptions so;
    so.reducer.bucket_cap_bytes = 512;
    so.reducer.first_bucket_cap_bytes = 256;
    so.reducer.timeout = absl::Seconds(60);
    so.reducer.mode = sched::ReduceMode::kReduceScatter;
    sched::ReducerGroups g;
    switch (m) {
      case kDense:
        g = {&world, nullptr};
        if (c.dense_hybrid) {
          so.reducer.mode = sched::ReduceMode::kHybrid;
          g = {r->dense_mesh.shard.get(), r->dense_mesh.replica.get()};
        }
        break;
      case kExpert:
        g = {r->expert_dp.get(), nullptr};
        break;
      case kTp:
        g = {r->tp_dp.get(), nullptr};
        break;
      default:
        g = {r->norm_dp.get(), nullptr};
    }
    std::vector<sched::ParamSpec> specs;
    for (size_t i = 0; i < kCounts[m].size(); ++i) {
      specs.push_back(sched::ParamSpec{static_cast<sched::ParamId>(i), kCounts[m][i], DType::kF32,
                                       Device::Cpu(), absl::StrCat("m", m, "p", i)});
    }
    ASSIGN_OR_RETURN(auto stack, TrainingStack::Create(std::move(specs), g, so));
    r->stacks.push_back(std::move(stack));
  }
  ParamOptions po;
  oc.timeout = absl::Seconds(60);
  po.optimizer = oc;
  po.timeout = absl::Seconds(60);
  if (c.linked) {
    std::vector<LinkedMember> members;
    for (int m = 0; m < kMembers; ++m) members.push_back({r->stacks[m].get(), po, m == kNorm});
    RETURN_IF_ERROR(AddLinkedParamSides(members, world, r->tp.get()));
  } else {
    for (int m = 0; m < kMembers; ++m) RETURN_IF_ERROR(r->stacks[m]->AddParamSide(po));
  }
  for (int m = 0; m < kMembers; ++m) {
    ShardedOptimizer* opt = r->stacks[m]->optimizer();
    for (size_t i = 0; i < kCounts[m].size(); ++i) {
      std::vector<float> init(kCounts[m][i]);
      for (size_t j = 0; j < init.size(); ++j) init[j] = Initial(m, Owner(m, me), i, j);
      RETURN_IF_ERROR(opt->SetParam(static_cast<sched::ParamId>(i), init.data()));
    }
    RETURN_IF_ERROR(opt->WaitAllParams());
  }
  return r;
}

// One step: every member's backward open at once, gradients marked in a random order across
// members (seeded by rank and step), then every FinishBackward and wait. A failure is returned
// after every backward was finished (the first one).
absl::Status RunStep(Rank& r, const Case& c, int me, int t) {
  for (auto& s : r.stacks) RETURN_IF_ERROR(s->BeginBackward(sched::SyncMode::kSync));
  std::vector<std::pair<int, int>> order;
  for (int m = 0; m < kMembers; ++m) {
    for (size_t i = 0; i < kCounts[m].size(); ++i) order.push_back({m, static_cast<int>(i)});
  }
  std::mt19937 rng(static_cast<uint32_t>(me * 1000 + t));
  std::shuffle(order.begin(), order.end(), rng);
  absl::Status first;
  for (auto [m, i] : order) {
    if (c.jitter && rng() % 3 == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 400));
    }
    sched::GradientReducer& red = r.stacks[m]->reducer();
    absl::StatusOr<TensorView> g = red.GradView(i);
    if (!g.ok()) return g.status();
    float* d = static_cast<float*>(g->data);
    for (size_t j = 0; j < g->count; ++j) d[j] += Grad(m, Source(m, me), t, i, j);
    if (t == c.inf_step && m == kExpert && me == 3 && i == 0) d[0] = INFINITY;
    absl::Status s = red.MarkReady(i);
    if (first.ok()) first = s;
  }
  for (auto& s : r.stacks) {
    absl::Status f = s->FinishBackward();
    if (first.ok()) first = f;
  }
  RETURN_IF_ERROR(first);
  for (auto& s : r.stacks) RETURN_IF_ERROR(s->optimizer()->WaitAllParams());
  return absl::OkStatus();
}

absl::Status CheckRank(Group& world, const Case& c) {
  OptimizerConfig oc;
  oc.max_grad_norm = c.max_grad_norm;
  oc.skip_nonfinite = c.skip_nonfinite;
  oc.track_grad_norm = c.track;
  oc.groups[0].adamw.lr = 0.05;  // large enough that a wrong clip factor changes the bits
  ASSIGN_OR_RETURN(std::unique_ptr<Rank> r, Build(world, c, oc));
  const int me = world.rank();
  for (int t = 0; t < c.steps; ++t) {
    RETURN_IF_ERROR(RunStep(*r, c, me, t));
    const Reference ref = Serial(c, me, oc.groups[0].adamw, t + 1);
    for (int m = 0; m < kMembers; ++m) {
      const StepReport rep = r->stacks[m]->optimizer()->last_step();
      RETURN_IF_ERROR(rep.error);
      const double norm = c.linked ? ref.norm : ref.member_norm[m];
      const bool same = std::isnan(norm) ? std::isnan(rep.grad_norm) : rep.grad_norm == norm;
      if (!same) {
        return absl::InternalError(absl::StrCat("rank ", me, " member ", m, " step ", t, ": norm ",
                                                rep.grad_norm, ", reference ", norm));
      }
      if (rep.skipped != (t == c.inf_step && c.skip_nonfinite))
        return absl::InternalError(absl::StrCat("member ", m, " step ", t, ": skipped flag"));
      for (size_t i = 0; i < kCounts[m].size(); ++i) {
        ASSIGN_OR_RETURN(TensorView v,
                         r->stacks[m]->gatherer()->ParamView(static_cast<sched::ParamId>(i)));
        const float* got = static_cast<const float*>(v.data);
        for (size_t j = 0; j < v.count; ++j) {
          if (std::memcmp(&got[j], &ref.params[m][i][j], sizeof(float)) != 0) {
            return absl::InternalError(absl::StrCat("rank ", me, " member ", m, " param ", i,
                                                    " element ", j, " after step ", t, ": got ",
                                                    got[j], ", want ", ref.params[m][i][j]));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

class LinkedOptimizersTest : public ::testing::TestWithParam<Case> {};

#if defined(BRAID_LINKED_MPI)
// Built a second time as mpi_linked_optimizers_test (mpirun -np 4, the `mpi` backend).
Group* the_world = nullptr;

TEST_P(LinkedOptimizersTest, MatchesSerialReference) {
  ASSERT_EQ(the_world->size(), kWorld) << "run under mpirun -np 4";
  EXPECT_OK(CheckRank(*the_world, GetParam()));
}
#else
TEST_P(LinkedOptimizersTest, MatchesSerialReference) {
  RunRanks(kWorld, [&](Group& world) { EXPECT_OK(CheckRank(world, GetParam())); });
}
#endif

INSTANTIATE_TEST_SUITE_P(
    Layouts, LinkedOptimizersTest,
    ::testing::Values(Case{"clip"}, Case{"clip_dense_hybrid", true},
                      Case{"skip_nonfinite_expert", false, 0.5, true, 1},
                      Case{"skip_only", false, 0.0, true},
                      Case{"track_only", false, 0.0, false, -1, true},
                      Case{"stress_jitter", false, 0.5, false, -1, false, true, 16, true},
                      Case{"stress_jitter_hybrid", true, 0.5, false, -1, false, true, 16, true},
                      Case{"stress_unlinked_jitter", false, 0.5, false, -1, false, false, 16,
                           true}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

#if !defined(BRAID_LINKED_MPI)
// One rank's expert reduction fails: no member steps on any rank (the dense trunk, the other
// expert group and the tensor-parallel shards reduced fine, but one norm makes one decision),
// every member reports the error, parameters stay at their initial values, nothing hangs.
TEST(LinkedOptimizersErrors, OneFailedReductionDropsEveryMembersStepOnEveryRank) {
  Options o = braid::testing::LocalOptions(kWorld, absl::Seconds(20));
  o.abort_on_failure = false;  // only the expert group fails; the norm's all-reduce still runs
  auto backend = CreateBackend(o);
  ASSERT_TRUE(backend.ok());
  auto* local = static_cast<local::LocalBackend*>(backend->get());
  const Case c{"fail"};
  RunRanks(**backend, [&](Group& world) {
    OptimizerConfig oc;
    oc.max_grad_norm = c.max_grad_norm;
    auto built = Build(world, c, oc);
    ASSERT_TRUE(built.ok()) << built.status();
    Rank& r = **built;
    const int me = world.rank();
    auto w = r.expert_dp->Barrier();
    ASSERT_TRUE(w.ok());
    ASSERT_OK((*w)->Wait(absl::Seconds(20)));
    if (me == 1) local->faults().FailRank(1, (*w)->info().seq + 1, "expert_dp", "link loss");
    auto wb = world.Barrier();
    ASSERT_TRUE(wb.ok());
    ASSERT_OK((*wb)->Wait(absl::Seconds(20)));
    const absl::Status st = RunStep(r, c, me, 0);
    if (me != 1 && me != 3) EXPECT_OK(st);  // their own reductions completed
    for (int m = 0; m < kMembers; ++m) {
      ShardedOptimizer* opt = r.stacks[m]->optimizer();
      EXPECT_OK(opt->WaitAllParams());
      EXPECT_FALSE(opt->last_step().error.ok()) << "rank " << me << " member " << m;
      for (size_t i = 0; i < kCounts[m].size(); ++i) {
        auto v = r.stacks[m]->gatherer()->ParamView(static_cast<sched::ParamId>(i));
        ASSERT_TRUE(v.ok());
        for (size_t j = 0; j < v->count; ++j) {
          ASSERT_EQ(static_cast<const float*>(v->data)[j], Initial(m, Owner(m, me), i, j))
              << "rank " << me << " member " << m << " param " << i << " was stepped";
        }
      }
    }
  });
}

TEST(LinkedOptimizersErrors, RefusesOverlapOffAndBadMembers) {
  RunRanks(2, [](Group& world) {
    StackOptions so;
    so.reducer.mode = sched::ReduceMode::kReduceScatter;
    so.reducer.timeout = absl::Seconds(60);
    auto specs =
        std::vector<sched::ParamSpec>{sched::ParamSpec{0, 8, DType::kF32, Device::Cpu(), "w"}};
    auto a = TrainingStack::Create(specs, {&world, nullptr}, so);
    ASSERT_TRUE(a.ok()) << a.status();
    ParamOptions po;
    po.optimizer = OptimizerConfig{};
    po.optimizer->max_grad_norm = 1.0;
    po.optimizer->overlap = false;
    ExpectError(AddLinkedParamSides({{a->get(), po}}, world, nullptr),
                absl::StatusCode::kInvalidArgument, {"reducer 0", "overlap"});
    EXPECT_FALSE((*a)->has_param_side());
    po.optimizer->overlap = true;
    ExpectError(AddLinkedParamSides({{a->get(), po}, {a->get(), po}}, world, nullptr),
                absl::StatusCode::kInvalidArgument, {"reducer 1", "reducer 0"});
    ParamOptions other = po;
    other.optimizer->max_grad_norm = 2.0;
    ExpectError(AddLinkedParamSides({{a->get(), po}, {a->get(), other}}, world, nullptr),
                absl::StatusCode::kInvalidArgument, {"reducer 1", "max_grad_norm"});
    ExpectError(AddLinkedParamSides({}, world, nullptr), absl::StatusCode::kInvalidArgument,
                {"no reducer"});
  });
}

#endif  // !BRAID_LINKED_MPI

}  // namespace
}  // namespace braid::optim

#if defined(BRAID_LINKED_MPI)
int main(int argc, char** argv) {
  return braid::testing::RunTestsOnMpiWorld(argc, argv, absl::Seconds(60),
                                            &braid::optim::the_world);
}
#endif
